"""Every ready config in configs/ is valid, and its model section builds."""

from __future__ import annotations

import dataclasses
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
    model_config = build_model_config(config.model, num_items=11, num_users=5)
    if model_config.uses_semantic_ids:  # training fills the sizes in from the tokenizer
        sizes = (config.tokenizer.codebook_size,) * (config.tokenizer.num_levels + 1)
        model_config = dataclasses.replace(model_config, codebook_sizes=sizes)  # type: ignore[call-arg]
    model = build_model(model_config)
    assert model.config.name == config.model["name"]
