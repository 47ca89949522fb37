"""Every ready config in configs/ is valid, and its model section builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from seqrec.config import experiment_from_raw, load_raw
from seqrec.models import build_model, build_model_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def test_the_issue_configs_exist() -> None:
    names = {p.name for p in CONFIGS}
    for name in (
        "ml-1m_sasrec",
        "beauty_sasrec",
        "video-games_sasrec",
        "ml-1m_sasrec-ce",
        "beauty_sasrec-ce",
    ):
        assert f"{name}.yaml" in names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_is_valid(path: Path) -> None:
    config = experiment_from_raw(load_raw(path))
    model = build_model(build_model_config(config.model, num_items=11, num_users=5))
    assert model.config.name == config.model["name"]
