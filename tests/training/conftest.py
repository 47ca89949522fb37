"""Fixtures for the training and serving tests: an isolated environment and a trained run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.helpers import tiny_raw, train_isolated


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SASRec trained for 3 epochs on 300 synthetic users (read-only: copy before changing)."""
    root = tmp_path_factory.mktemp("tiny-run")
    return train_isolated(tiny_raw(), root / "run", root / "cache")
