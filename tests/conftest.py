"""Shared fixtures: tiny odd sizes, a seeded left-padded batch, and no network or user cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from seqrec.batch import PAD_ID, SeqBatch
from tests.env import isolate
from tests.tiny import NUM_ITEMS, B, L, S

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No network, no user cache or data directory, no debug tracebacks; torch threads restored."""
    isolate(monkeypatch, tmp_path / "seqrec-cache")
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not torch.cuda.is_available():
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(pytest.mark.skip(reason="needs CUDA"))


@pytest.fixture
def batch() -> SeqBatch:
    """B left-padded rows of different lengths (one full, one empty-but-one), labels = next."""
    g = torch.Generator().manual_seed(0)
    items = torch.randint(1, NUM_ITEMS + 1, (B, L + 1), generator=g)
    lengths = torch.tensor([L, 3, 1])[:B]
    real = torch.arange(L).unsqueeze(0) >= (L - lengths).unsqueeze(1)  # (B, L)
    input_ids = torch.where(real, items[:, :-1], PAD_ID)
    labels = torch.where(real, items[:, 1:], PAD_ID)
    negatives = torch.randint(1, NUM_ITEMS + 1, (B, L, S), generator=g)
    negatives = torch.where(real.unsqueeze(-1), negatives, PAD_ID)
    return SeqBatch(
        input_ids=input_ids,
        labels=labels,
        negatives=negatives,
        users=torch.arange(B) % 4,
        same_target_ids=input_ids.roll(1, dims=0),  # stands in for DuoRec's positives
    )
