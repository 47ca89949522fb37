"""train.windows in the training loop: "all" trains older targets; prefix models refuse it;
train.window_stride reaches the batches and is refused where it cannot work."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from seqrec.cli import main
from tests.cli.helpers import losses, tiny_raw, write_yaml


def train(tmp_path: Path, name: str, **sections: dict[str, object]) -> int:
    config = write_yaml(tmp_path / f"{name}.yaml", tiny_raw(**sections))
    return main(["train", "--config", str(config), "--out", str(tmp_path / name)])


def test_all_windows_train_more_targets_than_the_last_window(tmp_path: Path) -> None:
    short = {"name": "sasrec", "hidden_size": 16, "max_seq_len": 4}
    assert train(tmp_path, "last", model=short, train={"max_epochs": 2}) == 0
    assert train(tmp_path, "all", model=short, train={"max_epochs": 2, "windows": "all"}) == 0
    last, every = losses(tmp_path / "last"), losses(tmp_path / "all")
    assert all(np.isfinite(every))
    assert last != every  # the setting reached the batches


def test_a_model_on_prefix_examples_refuses_all_windows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = {"name": "duorec", "hidden_size": 16, "num_heads": 1, "examples": "prefixes"}
    assert train(tmp_path, "duorec", model=model, train={"windows": "all"}) != 0
    assert "uses every target already: use train.windows: last" in capsys.readouterr().err


def test_an_unknown_windows_value_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert train(tmp_path, "bad", train={"windows": "newest"}) != 0
    assert "train.windows" in capsys.readouterr().err


def test_a_window_stride_trains_and_changes_the_training(tmp_path: Path) -> None:
    short = {"name": "sasrec", "hidden_size": 16, "max_seq_len": 4}
    every = {"max_epochs": 2, "windows": "all"}
    assert train(tmp_path, "all", model=short, train=every) == 0
    assert train(tmp_path, "strided", model=short, train={**every, "window_stride": 2}) == 0
    strided = losses(tmp_path / "strided")
    assert all(np.isfinite(strided))
    assert strided != losses(tmp_path / "all")


@pytest.mark.parametrize(
    ("model", "train_section", "message"),
    [
        ({}, {"window_stride": 2}, "train.window_stride cuts the windows of train.windows: all"),
        ({"max_seq_len": 4}, {"windows": "all", "window_stride": 5}, "above model.max_seq_len 4"),
        (
            {"name": "bert4rec", "hidden_size": 16, "num_heads": 1},
            {"windows": "all", "window_stride": 2},
            "bert4rec makes targets of its inputs",
        ),
        (
            {"name": "bpr", "hidden_size": 16},
            {"windows": "all", "window_stride": 2},
            "bpr makes targets of its inputs",
        ),
    ],
)
def test_a_window_stride_that_cannot_work_is_refused(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    model: dict[str, object],
    train_section: dict[str, object],
    message: str,
) -> None:
    assert train(tmp_path, "bad", model=model, train=train_section) != 0
    assert message in capsys.readouterr().err
