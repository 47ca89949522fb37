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


def _flatten(raw: dict[str, object], prefix: str = "") -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in raw.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


# The SASRec+ encoder's options, which a BERT4Rec backbone does not have.
BERT4REC_DROPS = ("layout", "dropout_placement", "init_std", "position_origin")

# A variant config is its base config with only these keys changed; anything else that
# differs is drift (a setting added to the base and forgotten in its ablations).
VARIANTS = {
    ("ml-1m_mamba4rec", "ml-1m_mamba4rec-pe"): {"model.positional_embedding"},
    ("ml-1m_mamba4rec", "ml-1m_mamba4rec-no-ffn"): {"model.ffn"},
    ("ml-1m_mamba4rec", "ml-1m_mamba4rec-2layers"): {"model.num_layers"},
    ("ml-1m_sasrec-ce", "ml-1m_sasrec-ce-all-windows"): {"train.windows"},
    ("ml-1m_sasrec-ce", "ml-1m_sasrec-ce-3000"): {
        "model.loss",
        "model.num_negatives",
        "model.negative_sampler",
        "model.shared_negatives",
    },
    **{
        (f"{ds}_recrec-stage2", f"{ds}_recrec-stage2-{variant}"): keys
        for ds in ("beauty", "ml-1m")
        for variant, keys in (
            ("n0", {"model.inner_steps"}),
            ("overwrite", {"model.gate"}),
            ("no-idr", {"model.idr_weight", "train.init_from"}),
        )
    },
    **{
        (f"{ds}_recrec-stage1", f"{ds}_recrec-stage1-no-idr"): {"model.idr_weight"}
        for ds in ("beauty", "ml-1m")
    },
    **{
        (f"beauty_recrec-stage{stage}", f"beauty_recrec-bert4rec-stage{stage}"): {
            "model.backbone",
            "model.num_heads",
            "model.train_positions",
            *(f"model.backbone_options.{key}" for key in BERT4REC_DROPS),
            *(("train.init_from",) if stage == 2 else ()),
        }
        for stage in (1, 2)
    },
}


@pytest.mark.parametrize(
    ("base", "variant"), sorted(VARIANTS), ids=[f"{a}->{b}" for a, b in sorted(VARIANTS)]
)
def test_variant_differs_from_its_base_only_where_declared(base: str, variant: str) -> None:
    folder = CONFIGS[0].parent
    a = _flatten(load_raw(folder / f"{base}.yaml"))
    b = _flatten(load_raw(folder / f"{variant}.yaml"))
    differing = {key for key in a.keys() | b.keys() if a.get(key) != b.get(key)}
    assert differing == VARIANTS[(base, variant)]
