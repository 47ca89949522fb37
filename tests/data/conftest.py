"""Fixtures for the data-layer tests: no network, no user cache, shared data when present."""

from __future__ import annotations

from pathlib import Path

import pytest

# <repo>/../shared/data: the shared datasets (present in CI; tests that need them skip otherwise).
SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _isolated_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """No test reaches the network or the user's cache or data directory."""
    monkeypatch.setenv("SEQREC_OFFLINE", "1")
    monkeypatch.setenv("SEQREC_CACHE_DIR", str(tmp_path_factory.mktemp("seqrec-cache")))
    monkeypatch.delenv("SEQREC_DATA_DIR", raising=False)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA
