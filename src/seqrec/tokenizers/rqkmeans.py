"""RQ-KMeans: residual k-means. Level l clusters what levels < l left unexplained.

    r_1 = x;  c_l = argmin_k ||r_l - E_l[k]||;  r_{l+1} = r_l - E_l[c_l]
    x ~ sum_l E_l[c_l]

Shapes: N items, D embedding width, M levels, C codes per level. Each level is a seeded,
vectorised k-means (k-means++ initialisation, Lloyd iterations, empty clusters re-seeded
with the points farthest from their centroid).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from seqrec.io import atomic_path

logger = logging.getLogger(__name__)

ArrayLike = npt.NDArray[Any] | Tensor


def as_tensor(x: ArrayLike) -> Tensor:
    """(N, D) float32 CPU tensor from a NumPy array or tensor."""
    t = torch.as_tensor(np.asarray(x) if not isinstance(x, Tensor) else x)
    if t.ndim != 2:
        raise ValueError(f"expected an (N, D) matrix, got shape {tuple(t.shape)}")
    return t.detach().float().cpu()


def sq_distances(x: Tensor, centroids: Tensor) -> Tensor:
    """(N, D), (C, D) -> (N, C) squared Euclidean distances (clamped at 0)."""
    d = x.pow(2).sum(1, keepdim=True) - 2 * x @ centroids.T + centroids.pow(2).sum(1)
    return d.clamp_min_(0)


def kmeans_plus_plus(x: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """(N, D) -> (k, D) initial centroids, each drawn with probability ~ D(x)^2."""
    n = x.shape[0]
    first = int(torch.randint(n, (1,), generator=generator))
    centroids = [x[first]]
    closest = sq_distances(x, x[first : first + 1]).squeeze(1)  # (N,)
    for _ in range(1, k):
        total = closest.sum()
        # All points already coincide with a centroid (duplicates): draw uniformly.
        weights = closest if total > 0 else torch.ones_like(closest)
        index = int(torch.multinomial(weights, 1, generator=generator))
        centroids.append(x[index])
        closest = torch.minimum(closest, sq_distances(x, x[index : index + 1]).squeeze(1))
    return torch.stack(centroids)


def kmeans(x: Tensor, k: int, iters: int, generator: torch.Generator) -> Tensor:
    """Lloyd's k-means on (N, D) rows -> (k, D) centroids. Needs N >= k."""
    n = x.shape[0]
    if n < k:
        raise ValueError(f"k-means with {k} clusters needs at least {k} points, got {n}")
    centroids = kmeans_plus_plus(x, k, generator)
    assign = torch.full((n,), -1, dtype=torch.long)
    for _ in range(iters):
        dist = sq_distances(x, centroids)  # (N, k)
        new_assign = dist.argmin(1)
        if torch.equal(new_assign, assign):
            break
        assign = new_assign
        counts = torch.bincount(assign, minlength=k)  # (k,)
        sums = torch.zeros_like(centroids).index_add_(0, assign, x)
        filled = counts > 0
        centroids[filled] = sums[filled] / counts[filled].unsqueeze(1).to(x.dtype)
        empty = (~filled).nonzero().squeeze(1)
        if len(empty):
            # Re-seed each empty cluster with one of the points worst served now.
            worst = dist.gather(1, assign.unsqueeze(1)).squeeze(1).argsort(descending=True)
            centroids[empty] = x[worst[: len(empty)]]
            assign = torch.full((n,), -1, dtype=torch.long)  # force another iteration
    return centroids


def quantize(x: Tensor, codebooks: Tensor) -> tuple[Tensor, Tensor]:
    """Residual quantisation of (N, D) with (M, C, D) codebooks -> (N, M) codes, (N, D) sum."""
    residual = x
    codes = []
    for codebook in codebooks:
        code = sq_distances(residual, codebook).argmin(1)
        codes.append(code)
        residual = residual - codebook[code]
    return torch.stack(codes, 1), x - residual


class RQKMeans:
    """Residual k-means with the fit/transform lifecycle; learned state in ``codebooks_``."""

    method = "rqkmeans"

    def __init__(self, num_levels: int, codebook_size: int, iters: int = 50, seed: int = 0) -> None:
        self.num_levels = num_levels
        self.codebook_size = codebook_size
        self.iters = iters
        self.seed = seed
        self.codebooks_: Tensor | None = None  # (M, C, D) after fit

    def fit(self, x: ArrayLike) -> RQKMeans:
        data = as_tensor(x)
        generator = torch.Generator().manual_seed(self.seed)
        residual = data
        codebooks = []
        for level in range(self.num_levels):
            centroids = kmeans(residual, self.codebook_size, self.iters, generator)
            code = sq_distances(residual, centroids).argmin(1)
            residual = residual - centroids[code]
            codebooks.append(centroids)
            logger.debug("rq-kmeans level %d: residual mse %.5f", level, residual.pow(2).mean())
        self.codebooks_ = torch.stack(codebooks)
        return self

    def _codebooks(self) -> Tensor:
        if self.codebooks_ is None:
            raise RuntimeError("RQKMeans is not fitted: call fit(x) first")
        return self.codebooks_

    def transform(self, x: ArrayLike) -> npt.NDArray[np.int64]:
        """(N, D) -> (N, M) int64 codes."""
        codes, _ = quantize(as_tensor(x), self._codebooks())
        return codes.numpy().astype(np.int64)

    def decode(self, codes: ArrayLike, levels: int | None = None) -> npt.NDArray[np.float32]:
        """(N, M) codes -> (N, D) reconstruction: the sum of the first ``levels`` codewords."""
        codebooks = self._codebooks()
        c = torch.as_tensor(np.asarray(codes), dtype=torch.long)
        used = self.num_levels if levels is None else levels
        out = torch.zeros(c.shape[0], codebooks.shape[2])
        for level in range(used):
            out += codebooks[level][c[:, level]]
        return out.numpy()

    def state_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "num_levels": self.num_levels,
            "codebook_size": self.codebook_size,
            "iters": self.iters,
            "seed": self.seed,
            "codebooks": self._codebooks().clone(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> RQKMeans:
        model = cls(state["num_levels"], state["codebook_size"], state["iters"], state["seed"])
        codebooks = torch.as_tensor(state["codebooks"]).float()
        if codebooks.shape[:2] != (model.num_levels, model.codebook_size):
            raise ValueError(f"codebooks of shape {tuple(codebooks.shape)} do not fit the state")
        model.codebooks_ = codebooks
        return model

    def save(self, path: str | Path) -> None:
        with atomic_path(Path(path)) as tmp:
            torch.save(self.state_dict(), tmp)

    @classmethod
    def load(cls, path: str | Path) -> RQKMeans:
        return cls.from_state(torch.load(path, map_location="cpu", weights_only=True))
