"""Test isolation: no network, a private cache, no user data directory, no debug tracebacks."""

from __future__ import annotations

from pathlib import Path

import pytest


def isolate(monkeypatch: pytest.MonkeyPatch, cache_dir: Path) -> None:
    monkeypatch.setenv("SEQREC_OFFLINE", "1")
    monkeypatch.setenv("SEQREC_CACHE_DIR", str(cache_dir))
    monkeypatch.delenv("SEQREC_DATA_DIR", raising=False)
    monkeypatch.delenv("SEQREC_DEBUG", raising=False)
