"""train.tensorboard writes event files, or says how to install the extra."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from seqrec.config import ConfigError, experiment_from_raw
from seqrec.training.run import train_experiment

RAW = {
    "data": {"dataset": "synthetic", "synthetic_users": 120, "synthetic_items": 60},
    "model": {"name": "sasrec", "hidden_size": 8, "max_seq_len": 10},
    "train": {"max_epochs": 1, "progress": False, "tensorboard": True},
}


def test_tensorboard_logging(tmp_path: Path) -> None:
    config = experiment_from_raw(RAW)
    if importlib.util.find_spec("tensorboard") is None:
        with pytest.raises(ConfigError, match=r"pip install 'seqrec\[tensorboard\]'"):
            train_experiment(config, tmp_path / "run")
        assert not (tmp_path / "run").exists()  # nothing half-written
    else:
        train_experiment(config, tmp_path / "run")
        assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
