"""Semantic IDs: every item's code path, made unique by a disambiguation level (TIGER).

``make_semantic_ids`` turns a tokeniser's codes into unique paths (training's
``seqrec.training.semantic_ids.fit_semantic_ids`` runs item embeddings -> tokeniser fit ->
codes -> disambiguation). The artifact (``SemanticIds``) is saved as ``semantic_ids.npz``
(codes) plus ``semantic_ids.json`` (vocabulary per level, original item ids, method, fit
facts and the sha256 of the npz), the JSON written last so a half-written artifact is refused.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from seqrec.config import TokenizerConfig
from seqrec.data.download import sha256_file
from seqrec.data.idmap import catalogue_difference
from seqrec.data.schema import DataError
from seqrec.io import atomic_write, atomic_write_text
from seqrec.tokenizers.rqkmeans import ArrayLike, RQKMeans
from seqrec.tokenizers.rqvae import RQVAE, RQVAEConfig

logger = logging.getLogger(__name__)

CODES_FILE = "semantic_ids.npz"
META_FILE = "semantic_ids.json"
TOKENIZER_FILE = "tokenizer.pt"
PAD_CODE = -1
Codes = npt.NDArray[np.int64]


class Tokenizer(Protocol):
    method: str

    def fit(self, x: ArrayLike) -> Any: ...
    def transform(self, x: ArrayLike) -> Codes: ...
    def decode(self, codes: ArrayLike, levels: int | None = None) -> npt.NDArray[np.float32]: ...
    def save(self, path: str | Path) -> None: ...


def disambiguate(codes: Codes) -> Codes:
    """(N, L) code paths -> (N, L + 1): a counter 0, 1, 2, ... among items with the same path,
    in item order. The extra level is always added (all zeros when paths are unique).

    >>> disambiguate(np.array([[1, 2], [0, 0], [1, 2], [1, 2]]))[:, 2].tolist()
    [0, 0, 1, 2]
    """
    n = codes.shape[0]
    if n == 0:
        return np.zeros((0, codes.shape[1] + 1), dtype=np.int64)
    _, group = np.unique(codes, axis=0, return_inverse=True)
    group = group.reshape(-1)
    order = np.argsort(group, kind="stable")  # items of one path together, in item order
    sorted_group = group[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_group)) + 1]
    first = np.repeat(starts, np.diff(np.r_[starts, n]))  # position of each run's first item
    counter = np.empty(n, dtype=np.int64)
    counter[order] = np.arange(n) - first
    return np.concatenate([codes.astype(np.int64), counter[:, None]], axis=1)


def perplexity(codes: npt.NDArray[np.int64]) -> float:
    """exp(entropy) of the empirical code distribution: the effective number of codes used."""
    _, counts = np.unique(codes, return_counts=True)
    p = counts / counts.sum()
    return float(np.exp(-(p * np.log(p)).sum()))


@dataclass(frozen=True, eq=False)
class SemanticIds:
    """The code paths of a catalogue.

    codes: (N + 1, M) int64; row 0 (padding) is -1, row i the path of internal item i, and
    the last column is the disambiguation level (M = num_levels + 1).
    codebook_sizes: (M,) vocabulary per level; the last is at least the codebook size.
    item_ids: original ids of items 1..N, to detect a dataset the codes do not belong to.
    """

    codes: Codes
    codebook_sizes: tuple[int, ...]
    item_ids: tuple[str, ...]
    method: str
    info: dict[str, Any] = field(default_factory=dict)  # how it was fitted (config, timings)

    def __post_init__(self) -> None:
        n, m = len(self.item_ids), len(self.codebook_sizes)
        if self.codes.shape != (n + 1, m):
            raise ValueError(f"codes of shape {self.codes.shape}, expected ({n + 1}, {m})")
        if (self.codes[0] != PAD_CODE).any():
            raise ValueError("row 0 of the codes (padding) must be -1")
        body = self.codes[1:]
        if n and (body.min() < 0 or (body >= np.asarray(self.codebook_sizes)).any()):
            raise ValueError("a code is outside its level's vocabulary")

    @property
    def num_items(self) -> int:
        return len(self.item_ids)

    @property
    def num_levels(self) -> int:
        """M, including the disambiguation level."""
        return len(self.codebook_sizes)

    def check_matches(self, item_ids: Sequence[str]) -> None:
        """Raise ``DataError`` unless ``item_ids`` (an IdMap's ``items``) are these items."""
        items = tuple(str(i) for i in item_ids)
        if items == self.item_ids:
            return
        detail = catalogue_difference(self.item_ids, items, "in the semantic IDs")
        raise DataError(
            f"the semantic IDs were fitted on another item catalogue ({detail}); refit the "
            "tokeniser on this data, or use the data section they were fitted with"
        )

    def report(self) -> dict[str, Any]:
        """Codebook usage per level and collisions of the paths before disambiguation."""
        body = self.codes[1:]
        paths = body[:, :-1]
        n = len(body)
        levels = [
            {
                "level": level,
                "vocabulary": self.codebook_sizes[level],
                "used_codes": len(np.unique(body[:, level])),
                "perplexity": perplexity(body[:, level]) if n else 0.0,
            }
            for level in range(self.num_levels)
        ]
        _, sizes = np.unique(paths, axis=0, return_counts=True) if n else (None, np.zeros(0))
        return {
            "method": self.method,
            "num_items": n,
            "levels": levels,
            "unique_paths": len(sizes),
            # fraction of items whose path (before disambiguation) another item also has
            "collision_rate": float(sizes[sizes > 1].sum() / n) if n else 0.0,
            "max_items_per_path": int(sizes.max()) if n else 0,
            **{k: v for k, v in self.info.items() if k != "config"},
        }

    def save(self, folder: str | Path, tokenizer_sha256: str | None = None) -> None:
        """Codes, then the metadata that records their sha256 (and that of the tokenizer
        saved beside them, when given: ``load_tokenizer`` checks it)."""
        folder = Path(folder)

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as handle:  # a file object: np.savez would append ".npz"
                np.savez(handle, codes=self.codes)

        atomic_write(folder / CODES_FILE, write)
        meta = {
            "method": self.method,
            "codebook_sizes": list(self.codebook_sizes),
            "item_ids": list(self.item_ids),
            "info": self.info,
            "codes_sha256": sha256_file(folder / CODES_FILE),
        }
        if tokenizer_sha256 is not None:
            meta["tokenizer_sha256"] = tokenizer_sha256
        atomic_write_text(folder / META_FILE, json.dumps(meta))

    @classmethod
    def load(cls, folder: str | Path) -> SemanticIds:
        folder = Path(folder)
        meta_path, codes_path = folder / META_FILE, folder / CODES_FILE
        if not folder.exists():
            raise DataError(f"{folder} does not exist (a folder of semantic IDs was expected)")
        if not meta_path.is_file() or not codes_path.is_file():
            raise DataError(f"{folder} holds no semantic IDs ({META_FILE} and {CODES_FILE})")
        try:
            meta = json.loads(meta_path.read_text())
            if sha256_file(codes_path) != meta["codes_sha256"]:
                raise ValueError(f"{CODES_FILE} does not match its recorded sha256")
            with np.load(codes_path, allow_pickle=False) as npz:
                codes = npz["codes"].astype(np.int64)
            return cls(
                codes=codes,
                codebook_sizes=tuple(int(c) for c in meta["codebook_sizes"]),
                item_ids=tuple(str(i) for i in meta["item_ids"]),
                method=str(meta["method"]),
                info=dict(meta.get("info", {})),
            )
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise DataError(f"semantic IDs in {folder} are damaged: {err}") from None


def make_semantic_ids(
    codes: Codes, codebook_size: int, item_ids: Sequence[str], method: str, **info: Any
) -> SemanticIds:
    """(N, L) tokeniser codes -> ``SemanticIds`` with the disambiguation level and PAD row."""
    full = disambiguate(codes)
    needed = int(full[:, -1].max()) + 1 if len(full) else 1
    if needed > codebook_size:
        logger.warning(
            "the disambiguation level needs %d codes (up to %d items share one path), more "
            "than codebook_size %d: its vocabulary grows to %d",
            needed,
            needed,
            codebook_size,
            needed,
        )
    sizes = (codebook_size,) * codes.shape[1] + (max(codebook_size, needed),)
    padded = np.concatenate([np.full((1, full.shape[1]), PAD_CODE, dtype=np.int64), full])
    return SemanticIds(padded, sizes, tuple(str(i) for i in item_ids), method, dict(info))


def build_tokenizer(config: TokenizerConfig, input_dim: int) -> Tokenizer:
    if config.method == "rqkmeans":
        return RQKMeans(config.num_levels, config.codebook_size, config.kmeans_iters, config.seed)
    return RQVAE(
        RQVAEConfig(
            input_dim=input_dim,
            hidden_sizes=config.hidden_sizes,
            latent_dim=config.latent_dim,
            num_levels=config.num_levels,
            codebook_size=config.codebook_size,
            commitment=config.commitment,
            epochs=config.rqvae_epochs,
            lr=config.rqvae_lr,
            batch_size=config.rqvae_batch_size,
            kmeans_iters=config.kmeans_iters,
            seed=config.seed,
        )
    )


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A tokeniser saved by ``save`` (RQ-KMeans or RQ-VAE). Beside semantic IDs whose
    metadata records the tokenizer's sha256, the file must match it (a rewrite of the folder
    cut short would leave a new tokenizer beside the old IDs)."""
    import torch

    path = Path(path)
    meta_path = path.parent / META_FILE
    if meta_path.is_file():
        try:
            recorded = json.loads(meta_path.read_text()).get("tokenizer_sha256")
        except (OSError, ValueError, AttributeError):
            recorded = None  # damaged IDs are SemanticIds.load's to report
        if recorded is not None and sha256_file(path) != recorded:
            raise DataError(
                f"{path} is not the tokenizer of the semantic IDs beside it ({META_FILE} "
                "records another): tokenize again"
            )
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state.get("method") == RQKMeans.method:
        return RQKMeans.from_state(state)
    if state.get("method") == RQVAE.method:
        return RQVAE.from_state(state)
    raise DataError(f"{path} is not a saved seqrec tokeniser")


def format_report(report: dict[str, Any]) -> str:
    """The report as a small table, for the command line."""
    lines = [f"{'level':>5}  {'vocabulary':>10}  {'used':>6}  {'perplexity':>10}"]
    for row in report["levels"]:
        lines.append(
            f"{row['level']:>5}  {row['vocabulary']:>10}  {row['used_codes']:>6}  "
            f"{row['perplexity']:>10.1f}"
        )
    lines[-1] += "   (disambiguation)"
    lines.append(
        f"items {report['num_items']:,}; unique paths before disambiguation "
        f"{report['unique_paths']:,}; collision rate {report['collision_rate']:.4f}; "
        f"max items per path {report['max_items_per_path']}"
    )
    extras = [
        f"{key} {report[key]:.4g}" if isinstance(report[key], float) else f"{key} {report[key]}"
        for key in (
            "embed_seconds",
            "fit_seconds",
            "reconstruction_mse",
            "embedding_variance",
            "items_without_text",
            "duplicate_texts",
        )
        if key in report
    ]
    if extras:
        lines.append("; ".join(extras))
    return "\n".join(lines)
