"""Fixtures for the analysis tests: a tiny SASRec with non-trivial weights, trained runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from seqrec.models.sasrec import SASRec, SASRecConfig
from tests.cli.helpers import tiny_raw, train_isolated
from tests.tiny import NUM_ITEMS, L


def tiny_sasrec(**changes: object) -> SASRec:
    """Two blocks, two heads, odd sizes; weights perturbed so LayerNorms and biases matter."""
    torch.manual_seed(0)
    config = SASRecConfig(
        num_items=NUM_ITEMS, max_seq_len=L, hidden_size=18, num_heads=2, num_layers=2
    )
    model = SASRec(dataclasses.replace(config, **changes))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    return model.eval()


@pytest.fixture
def model() -> SASRec:
    return tiny_sasrec()


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SASRec trained 3 epochs on 300 synthetic users, leave-one-out (read-only)."""
    root = tmp_path_factory.mktemp("analysis-run")
    return train_isolated(tiny_raw(), root / "run", root / "cache")


@pytest.fixture(scope="session")
def pop_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A popularity run: not a causal self-attention model."""
    root = tmp_path_factory.mktemp("analysis-pop")
    raw = tiny_raw(train={"max_epochs": 1})
    raw["model"] = {"name": "pop"}
    return train_isolated(raw, root / "run", root / "cache")
