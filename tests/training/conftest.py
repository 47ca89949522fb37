"""Fixtures for the training and serving tests: an isolated environment and a trained run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.cli.helpers import isolate, tiny_raw, train_isolated


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No network, no user cache or data directory, no debug tracebacks; torch threads restored."""
    isolate(monkeypatch, tmp_path / "seqrec-cache")
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SASRec trained for 3 epochs on 300 synthetic users (read-only: copy before changing)."""
    root = tmp_path_factory.mktemp("tiny-run")
    return train_isolated(tiny_raw(), root / "run", root / "cache")
