"""Strict configs: unknown keys and bad values are errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from seqrec.config import (
    ConfigError,
    DataConfig,
    EvalConfig,
    TrainConfig,
    experiment_from_raw,
    from_dict,
    load_raw,
    set_dotted,
)


def test_the_issue_minimal_config_is_complete() -> None:
    config = experiment_from_raw(
        {
            "data": {"dataset": "lastfm"},
            "model": {"name": "sasrec"},
            "train": {"max_epochs": 3, "seed": 1},
        }
    )
    assert config.data.dataset == "lastfm"
    assert config.train.max_epochs == 3
    assert config.eval.protocol == "full"


def test_unknown_key_names_valid_ones() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown key\(s\) train.learning_rate; valid train keys: .*lr"
    ):
        from_dict(TrainConfig, {"learning_rate": 1e-3}, "train")


def test_bad_literal_lists_allowed_values() -> None:
    with pytest.raises(ConfigError, match="eval.protocol: 'fast' is not one of 'full', 'sampled'"):
        from_dict(EvalConfig, {"protocol": "fast"}, "eval")


def test_wrong_type_is_named() -> None:
    with pytest.raises(ConfigError, match="train.batch_size: expected int"):
        from_dict(TrainConfig, {"batch_size": "big"}, "train")


def test_unknown_section() -> None:
    with pytest.raises(ConfigError, match="unknown section"):
        experiment_from_raw({"trian": {}})


def test_set_overrides_parse_values() -> None:
    raw: dict[str, object] = {}
    set_dotted(raw, "train.lr=3e-4")
    set_dotted(raw, "train.precision=bf16")
    set_dotted(raw, "eval.ks=[1,10]")
    set_dotted(raw, "data.timestamp_column=null")
    config = experiment_from_raw(raw)
    assert config.train.lr == 3e-4
    assert config.train.precision == "bf16"
    assert config.eval.ks == (1, 10)
    assert config.data.timestamp_column is None
    with pytest.raises(ConfigError, match="not of the form section.key=value"):
        set_dotted(raw, "lr")


def test_yaml_file_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("data: {dataset: synthetic}\ntrain: {max_epochs: 2}\n")
    config = experiment_from_raw(load_raw(path, ["train.max_epochs=5"]))
    assert config.train.max_epochs == 5
    (tmp_path / "bad.yaml").write_text("data: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_raw(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="does not exist"):
        load_raw(tmp_path / "missing.yaml")


def test_value_validation() -> None:
    with pytest.raises(ConfigError, match="temporal_quantile"):
        DataConfig(temporal_quantile=1.5)
    with pytest.raises(ConfigError, match="dataset: file needs data.path"):
        DataConfig(dataset="file")
