"""RQ-KMeans: k-means recovers clusters, residual levels refine, fits are seeded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from seqrec.tokenizers.rqkmeans import RQKMeans, kmeans
from tests.tokenizers.conftest import clustered


def test_first_level_recovers_the_clusters() -> None:
    x, labels = clustered(clusters=6)
    codes = RQKMeans(num_levels=2, codebook_size=6, seed=3).fit(x).transform(x)
    assert codes.shape == (600, 2)
    assert codes.dtype == np.int64
    # One code per cluster and one cluster per code: a bijection between labels and codes.
    pairs = set(zip(labels.tolist(), codes[:, 0].tolist(), strict=True))
    assert len(pairs) == 6
    assert len({c for _, c in pairs}) == 6


def test_reconstruction_error_falls_with_every_level() -> None:
    x, _ = clustered(noise=1.0)
    model = RQKMeans(num_levels=3, codebook_size=8, seed=0).fit(x)
    codes = model.transform(x)
    errors = [float(np.mean((model.decode(codes, levels) - x) ** 2)) for levels in range(4)]
    assert errors[0] == pytest.approx(float(np.mean(x**2)))  # zero levels decode to 0
    assert errors[1] < errors[0] / 5
    assert errors[3] < errors[2] < errors[1]
    np.testing.assert_allclose(model.decode(codes), model.decode(codes, 3))


def test_seeded_fits_are_identical_and_seeds_differ() -> None:
    x, _ = clustered(noise=1.5)
    a = RQKMeans(2, 16, seed=1).fit(x)
    b = RQKMeans(2, 16, seed=1).fit(x)
    c = RQKMeans(2, 16, seed=2).fit(x)
    np.testing.assert_array_equal(a.transform(x), b.transform(x))
    assert a.codebooks_ is not None
    assert c.codebooks_ is not None
    assert not torch.equal(a.codebooks_, c.codebooks_)


def test_state_round_trip(tmp_path: Path) -> None:
    x, _ = clustered()
    model = RQKMeans(2, 5, iters=7, seed=4).fit(x)
    model.save(tmp_path / "tok.pt")
    loaded = RQKMeans.load(tmp_path / "tok.pt")
    assert (loaded.num_levels, loaded.codebook_size, loaded.iters, loaded.seed) == (2, 5, 7, 4)
    np.testing.assert_array_equal(loaded.transform(x), model.transform(x))
    bad = model.state_dict() | {"codebook_size": 6}
    with pytest.raises(ValueError, match="do not fit"):
        RQKMeans.from_state(bad)


def test_unfitted_and_too_few_points_are_errors() -> None:
    with pytest.raises(RuntimeError, match="not fitted"):
        RQKMeans(1, 4).transform(np.zeros((3, 2), dtype=np.float32))
    with pytest.raises(ValueError, match="at least 4 points"):
        RQKMeans(1, 4).fit(np.zeros((3, 2), dtype=np.float32))


def test_kmeans_reseeds_empty_clusters_and_survives_duplicates() -> None:
    # 3 distinct points repeated, 3 clusters: every cluster must own one distinct point.
    x = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]]).repeat(20, 1)
    centroids = kmeans(x, 3, iters=20, generator=torch.Generator().manual_seed(0))
    assert sorted(map(tuple, centroids.tolist())) == [(0.0, 0.0), (0.0, 10.0), (10.0, 0.0)]
    # More clusters than distinct points: still k centroids, all of them real points.
    centroids = kmeans(x, 5, iters=5, generator=torch.Generator().manual_seed(0))
    assert centroids.shape == (5, 2)
    assert torch.isfinite(centroids).all()
