"""Fixtures for the tokeniser tests: clustered embeddings and a hand-written MovieLens folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from seqrec.config import DataConfig
from seqrec.data.prepare import prepare
from seqrec.data.sequences import PreparedData

# <repo>/../shared/data: the shared datasets (tests that need them skip when absent).
SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"

# 7 movies; movie 6 has no line in movies.dat, 3 and 5 share a title and genres.
MOVIES = """1::Toy Story (1995)::Animation|Children's|Comedy
2::Jumanji (1995)::Adventure|Children's|Fantasy
3::Heat (1995)::Action|Crime|Thriller
4::Sabrina (1995)::Comedy|Romance
5::Heat (1995)::Action|Crime|Thriller
7::Caf\xe9 au lait (1993)::Comedy
"""
# user::movie::rating::time; every movie is rated, so every movie is an item. Training
# sequences (leave-one-out drops the last two): [1, 6, 2], [3, 4], [6], [6, 7].
RATINGS = [
    *[(1, m) for m in (1, 6, 2, 3, 4)],
    *[(2, m) for m in (3, 4, 5, 1)],
    *[(3, m) for m in (6, 7, 1)],
    *[(4, m) for m in (6, 7, 5, 2)],
]


@pytest.fixture
def movielens_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "ml-tiny"
    folder.mkdir()
    (folder / "movies.dat").write_bytes(MOVIES.encode("latin-1"))
    lines = [f"{u}::{m}::5::{t}" for t, (u, m) in enumerate(RATINGS)]
    (folder / "ratings.dat").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture
def movielens(movielens_dir: Path) -> PreparedData:
    config = DataConfig(
        dataset="file",
        path=str(movielens_dir / "ratings.dat"),
        timestamp_column="timestamp",
        min_user_interactions=1,
        min_item_interactions=1,
    )
    return prepare(config, use_cache=False)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


def clustered(
    n: int = 600, clusters: int = 6, dim: int = 12, noise: float = 0.2, seed: int = 0
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """(n, dim) points around ``clusters`` well separated centres, and their cluster labels."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, dim)) * 4
    labels = rng.integers(0, clusters, n)
    x = centres[labels] + rng.normal(size=(n, dim)) * noise
    return x.astype(np.float32), labels
