"""Strict configs: unknown keys and bad values are errors that name the key."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from seqrec.config import (
    ConfigError,
    DataConfig,
    EvalConfig,
    TokenizerConfig,
    TrainConfig,
    experiment_from_raw,
    from_dict,
    load_raw,
    set_dotted,
    warn_once,
)
from seqrec.training.loop import check_train_config


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


def test_max_history_leaves_leave_one_out_a_training_target() -> None:
    with pytest.raises(ConfigError, match="max_history must be >= 4 with data.split"):
        from_dict(DataConfig, {"max_history": 3}, "data")
    assert from_dict(DataConfig, {"max_history": 4}, "data").max_history == 4
    temporal = {"max_history": 3, "split": "global_temporal"}
    assert from_dict(DataConfig, temporal, "data").max_history == 3


def test_unknown_section() -> None:
    with pytest.raises(ConfigError, match="unknown section"):
        experiment_from_raw({"trian": {}})


def test_set_overrides_parse_values() -> None:
    raw: dict[str, object] = {}
    set_dotted(raw, "train.lr=3e-4")
    set_dotted(raw, "train.precision=bf16")
    set_dotted(raw, "eval.ks=[1,10]")
    set_dotted(raw, "data.dataset=file")  # column names are read from a file of one's own
    set_dotted(raw, "data.path=log.csv")
    set_dotted(raw, "data.timestamp_column=null")
    set_dotted(raw, 'data.user_column="2024"')  # quoted: a column named like a number
    set_dotted(raw, "data.item_column='007'")
    set_dotted(raw, "train.betas=(0.9,0.98)")  # a Python tuple
    config = experiment_from_raw(raw)
    assert config.train.lr == 3e-4
    assert config.train.precision == "bf16"
    assert config.eval.ks == (1, 10)
    assert config.train.betas == (0.9, 0.98)
    assert config.data.timestamp_column is None
    assert config.data.user_column == "2024"
    assert config.data.item_column == "007"
    with pytest.raises(ConfigError, match="not of the form section.key=value"):
        set_dotted(raw, "lr")


def test_yaml_file_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("data: {dataset: synthetic}\ntrain: {max_epochs: 2}\n")
    config = experiment_from_raw(load_raw(path, ["train.max_epochs=5"]))
    assert config.train.max_epochs == 5
    (tmp_path / "bad.yaml").write_text("data: [1, 2\n")
    one_line = r"not valid YAML: .* but got '<stream end>' \(line 2, column 1\)$"
    with pytest.raises(ConfigError, match=one_line):
        load_raw(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="does not exist"):
        load_raw(tmp_path / "missing.yaml")


def test_value_validation() -> None:
    with pytest.raises(ConfigError, match="temporal_quantile"):
        DataConfig(temporal_quantile=1.5)
    with pytest.raises(ConfigError, match="dataset: file needs data.path"):
        DataConfig(dataset="file")
    with pytest.raises(ConfigError, match="data.path is read only with data.dataset: file"):
        DataConfig(path="my_log.csv")  # the default dataset would be read instead of the file
    with pytest.raises(ConfigError, match=r"data\.synthetic_users must be >= 1 .* got 0 and 1000"):
        DataConfig(dataset="synthetic", synthetic_users=0)


@pytest.mark.parametrize(
    ("section", "value"),
    [
        ("model", 5),
        ("model", []),
        ("data", 0),
        ("data", ""),
        ("train", []),
        ("eval", "full"),
        ("tokenizer", False),
    ],
)
def test_section_that_is_not_a_mapping_is_named(section: str, value: object) -> None:
    with pytest.raises(
        ConfigError, match=rf"section {section} must be a mapping .*got {re.escape(repr(value))}"
    ):
        experiment_from_raw({section: value})


def test_model_given_as_a_name_suggests_the_mapping() -> None:
    with pytest.raises(ConfigError, match=r"section model .*write `model: \{name: sasrec\}`"):
        experiment_from_raw({"model": "sasrec"})


def test_override_into_a_section_that_is_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model: sasrec\n")
    with pytest.raises(ConfigError, match=r"section model .*`model: \{name: sasrec\}`"):
        load_raw(path, ["model.hidden_size=64"])


def test_null_sections_are_empty(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("data:\nmodel:\ntrain:\neval:\ntokenizer:\n")
    assert experiment_from_raw(load_raw(path)) == experiment_from_raw({})
    config = experiment_from_raw(load_raw(path, ["model.name=gru4rec", "train.lr=0.01"]))
    assert config.model == {"name": "gru4rec"}
    assert config.train.lr == 0.01


def test_exponent_without_a_dot_in_yaml_is_a_float(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("train: {lr: 3e-4, weight_decay: 1E-3, betas: [9e-1, 0.98]}\n")
    raw = load_raw(path)
    assert raw["train"]["lr"] == "3e-4"  # YAML 1.1 needs a dot in a float
    train = experiment_from_raw(raw).train
    assert train.lr == 0.0003
    assert train.weight_decay == 0.001
    assert train.betas == (0.9, 0.98)


@pytest.mark.parametrize("value", ["fast", "", "nan", "inf", "-Infinity", True, [1e-3]])
def test_float_field_rejects_non_numbers(value: object) -> None:
    with pytest.raises(ConfigError, match="train.lr: expected"):
        from_dict(TrainConfig, {"lr": value}, "train")


BAD_TRAIN = [
    ("lr", 0.0, "finite number > 0"),
    ("lr", float("nan"), "finite number > 0"),
    ("lr", float("inf"), "finite number > 0"),
    ("weight_decay", -1.0, "finite number >= 0"),
    ("weight_decay", float("nan"), "finite number >= 0"),
    ("weight_decay", float("inf"), "finite number >= 0"),
    ("betas", [0.9], "two values, each in [0, 1)"),
    ("betas", [0.9, 0.98, 0.5], "two values, each in [0, 1)"),
    ("betas", [1.0, 0.98], "two values, each in [0, 1)"),
    ("betas", [0.9, -0.1], "two values, each in [0, 1)"),
    ("betas", [0.9, float("nan")], "two values, each in [0, 1)"),
    ("batch_size", 0, ">= 1"),
    ("max_epochs", 0, ">= 1"),  # 0 would save the untrained initial weights as a result
    ("max_epochs", -1, ">= 1"),
    ("patience", 0, ">= 1"),
    ("grad_clip", 0.0, "> 0, or null for no clipping"),
    ("grad_clip", -1.0, "> 0, or null for no clipping"),
    ("grad_clip", float("nan"), "> 0, or null for no clipping"),
    ("grad_clip", float("inf"), "> 0, or null for no clipping"),
    ("time_budget_minutes", 0.0, "> 0, or null for no limit"),
    ("time_budget_minutes", float("nan"), "> 0, or null for no limit"),
    ("time_budget_minutes", float("inf"), "> 0, or null for no limit"),
    ("collective_timeout_minutes", 0.0, "> 0"),
    ("collective_timeout_minutes", float("inf"), "> 0"),
    ("num_threads", 0, ">= 1, or null for all cores"),
    ("num_threads", -1, ">= 1, or null for all cores"),
    ("seed", -1, "in [0, 2**64)"),
    ("seed", 2**64, "in [0, 2**64)"),
]


@pytest.mark.parametrize(("key", "value", "allowed"), BAD_TRAIN)
def test_train_value_out_of_range_is_named(key: str, value: object, allowed: str) -> None:
    with pytest.raises(
        ConfigError, match=re.escape(f"train.{key} must be") + ".*" + re.escape(allowed)
    ):
        from_dict(TrainConfig, {key: value}, "train")


@pytest.mark.parametrize(
    ("cls", "section", "key", "value"),
    [
        (EvalConfig, "eval", "num_negatives", 0),
        (EvalConfig, "eval", "batch_size", 0),
        (EvalConfig, "eval", "seed", -1),
        (DataConfig, "data", "synthetic_seed", -1),
        (TokenizerConfig, "tokenizer", "seed", 2**64),
        (TokenizerConfig, "tokenizer", "num_levels", 0),
        (TokenizerConfig, "tokenizer", "codebook_size", 1),
        (TokenizerConfig, "tokenizer", "latent_dim", 0),
        (TokenizerConfig, "tokenizer", "rqvae_epochs", -1),
        (TokenizerConfig, "tokenizer", "rqvae_lr", 0.0),
        (TokenizerConfig, "tokenizer", "rqvae_lr", -0.005),
        (TokenizerConfig, "tokenizer", "commitment", -0.25),
        (TokenizerConfig, "tokenizer", "rqvae_batch_size", 0),  # once "range() arg 3 ..."
        (TokenizerConfig, "tokenizer", "kmeans_iters", -1),  # once read as 0
        (TokenizerConfig, "tokenizer", "hidden_sizes", [0]),  # once one code for every item
    ],
)
def test_other_value_out_of_range_is_named(
    cls: type[Any], section: str, key: str, value: float
) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"{section}.{key} must be") + ".*got"):
        from_dict(cls, {key: value}, section)


# Every float key of every section, with the range its message states. A comparison with NaN
# is always False, so a check written as `value <= 0` lets NaN through.
FLOAT_KEYS = [
    (DataConfig, "data", "temporal_quantile", "in (0, 1)"),
    (DataConfig, "data", "min_rating", "a finite number, or null to keep all ratings"),
    (TrainConfig, "train", "lr", "a finite number > 0"),
    (TrainConfig, "train", "weight_decay", "a finite number >= 0"),
    (TrainConfig, "train", "grad_clip", "a finite number > 0, or null for no clipping"),
    (TrainConfig, "train", "time_budget_minutes", "a finite number > 0, or null for no limit"),
    (TokenizerConfig, "tokenizer", "rqvae_lr", "a finite number > 0"),
    (TokenizerConfig, "tokenizer", "commitment", "a finite number >= 0"),
]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize(("cls", "section", "key", "allowed"), FLOAT_KEYS)
def test_float_that_is_not_finite_is_named_with_its_value(
    cls: type[Any], section: str, key: str, allowed: str, value: float
) -> None:
    with pytest.raises(
        ConfigError, match=re.escape(f"{section}.{key} must be {allowed}, got {value}")
    ):
        from_dict(cls, {key: value}, section)


def test_yaml_nan_learning_rate_of_the_tokenizer_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("tokenizer: {rqvae_lr: .nan}\n")  # YAML's NaN is a float, not a string
    with pytest.raises(
        ConfigError, match=r"tokenizer\.rqvae_lr must be a finite number > 0, got nan"
    ):
        experiment_from_raw(load_raw(path))


def test_edge_values_in_range_are_accepted() -> None:
    train = from_dict(
        TrainConfig,
        {"weight_decay": 0, "betas": [0, 0.999], "grad_clip": 1e-6, "num_threads": 1},
        "train",
    )
    assert train.betas == (0.0, 0.999)
    assert from_dict(TrainConfig, {"seed": 2**64 - 1, "grad_clip": None}, "train").grad_clip is None
    assert from_dict(EvalConfig, {"seed": 0, "batch_size": None}, "eval").batch_size is None
    assert from_dict(TrainConfig, {"max_epochs": 1}, "train").max_epochs == 1
    tokenizer = from_dict(TokenizerConfig, {"commitment": 0, "rqvae_epochs": 0}, "tokenizer")
    assert (tokenizer.commitment, tokenizer.rqvae_epochs) == (0.0, 0)
    assert from_dict(DataConfig, {"min_rating": -1}, "data").min_rating == -1.0


def test_config_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("data: {dataset: caf\u00e9}\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"config file .*latin1.yaml is not UTF-8 text"):
        load_raw(path)


def test_config_path_that_is_a_directory_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config file .* is a directory"):
        load_raw(tmp_path)


@pytest.mark.parametrize(
    ("build", "warning"),
    [
        (  # ml-1m's files have fixed layouts
            lambda: DataConfig(user_column="uid", rating_column="stars"),
            "data.user_column, data.rating_column: read only with data.dataset: file, not with "
            "data.dataset: ml-1m; ignored",
        ),
        (
            lambda: DataConfig(dataset="file", path="log.csv", synthetic_users=10),
            "data.synthetic_users: read only with data.dataset: synthetic, not with "
            "data.dataset: file; ignored",
        ),
        (  # the reused IDs keep the settings they were fitted with
            lambda: TokenizerConfig(from_run="runs/tiger", num_levels=5, method="rqkmeans"),
            "tokenizer.from_run reuses that run's semantic IDs, fitted with its own settings; "
            "tokenizer.method, tokenizer.num_levels change nothing",
        ),
        (
            lambda: check_train_config(
                experiment_from_raw({"model": {"name": "sasrec"}, "tokenizer": {"num_levels": 4}})
            ),
            "the tokenizer section makes semantic IDs for generative models; sasrec does not "
            "use them: ignored",
        ),
        (
            lambda: check_train_config(
                experiment_from_raw(
                    {
                        "model": {
                            "name": "sasrec",
                            "loss": "sampled_softmax",
                            "negative_sampler": "in_batch",
                        },
                        "train": {"batch_size": 1},
                    }
                )
            ),
            "in-batch negatives are the batch's own targets: with train.batch_size 1 they come "
            "from one sequence, and a row that trains one target has none (its loss is 0)",
        ),
    ],
    ids=["columns", "synthetic", "from_run", "tokenizer", "in_batch"],
)
def test_a_setting_that_changes_nothing_is_named_once(
    build: Callable[[], object], warning: str, caplog: pytest.LogCaptureFixture
) -> None:
    """These were accepted and ignored without a word (a warning, not an error: --set cannot
    remove a key, and a config's dataset must stay switchable with --set alone)."""
    warn_once.cache_clear()
    with caplog.at_level("WARNING", logger="seqrec.config"):
        build()
        build()
    assert [record.getMessage() for record in caplog.records] == [warning]
    caplog.clear()
    TokenizerConfig(from_run="runs/tiger")  # alone: nothing to say
    DataConfig(dataset="file", path="log.csv", user_column="uid")
    assert not caplog.records
