"""Fixtures for the CLI tests: an isolated environment and trained run directories."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tests.cli.helpers import prefixed_log, tiny_raw, train_isolated


@pytest.fixture(scope="session")
def log_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CSV interaction log with string ids ("u12", "i7") and timestamps, with repeats."""
    path = tmp_path_factory.mktemp("log") / "log.csv"
    prefixed_log(300, 200, seed=0).write_csv(path)
    return path


@pytest.fixture(scope="session")
def log(log_csv: Path) -> pl.DataFrame:
    """The log as strings, in (user, time) order."""
    df = pl.read_csv(log_csv, infer_schema=False)
    return df.with_columns(pl.col("timestamp").cast(pl.Int64)).sort(["user_id", "timestamp"])


def file_raw(log_csv: Path) -> dict[str, dict[str, object]]:
    """The CSV log as ``dataset: file``, no k-core: every row of the file is used."""
    data = {
        "dataset": "file",
        "path": str(log_csv),
        "timestamp_column": "timestamp",
        "min_user_interactions": 1,
        "min_item_interactions": 1,
    }
    return tiny_raw(data=data, train={"max_epochs": 3})


@pytest.fixture(scope="session")
def file_run(tmp_path_factory: pytest.TempPathFactory, log_csv: Path) -> Path:
    """A run directory trained on the CSV log (read-only: copy it before changing it)."""
    root = tmp_path_factory.mktemp("file-run")
    return train_isolated(file_raw(log_csv), root / "run", root / "cache")
