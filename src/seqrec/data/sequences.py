"""Compact prepared data: per-user item sequences as CSR arrays, splits and the IdMap holder.

Everything downstream of preprocessing (training batches, evaluation, serving) reads these
arrays with NumPy indexing; nothing iterates over interactions in Python.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

from seqrec.config import SplitChoice
from seqrec.data.idmap import IdMap

IntArray = npt.NDArray[np.int64]
ItemArray = npt.NDArray[np.int32]


@dataclass(frozen=True)
class Sequences:
    """A ragged array: row u is ``items[offsets[u]:offsets[u + 1]]`` (oldest first).

    offsets: (U + 1,) int64, starting at 0; items: (nnz,) int32 internal item ids (1..N).
    """

    offsets: IntArray
    items: ItemArray

    def __post_init__(self) -> None:
        assert self.offsets.ndim == 1
        assert self.offsets[0] == 0
        assert self.offsets[-1] == len(self.items)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, row: int) -> ItemArray:
        return self.items[self.offsets[row] : self.offsets[row + 1]]

    @property
    def lengths(self) -> IntArray:
        return np.diff(self.offsets)

    @classmethod
    def from_lists(cls, rows: list[list[int]] | list[ItemArray]) -> Sequences:
        lengths = np.array([len(r) for r in rows], dtype=np.int64)
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        items = (
            np.concatenate([np.asarray(r, dtype=np.int32) for r in rows])
            if rows
            else np.zeros(0, dtype=np.int32)
        )
        return cls(offsets, items.astype(np.int32, copy=False))

    def take(self, rows: IntArray) -> Sequences:
        """The sub-ragged-array of ``rows``, vectorised."""
        lengths = self.lengths[rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        starts = self.offsets[rows]
        index = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
        return Sequences(offsets, self.items[index])

    def truncate_end(self, drop: IntArray) -> Sequences:
        """Drop the last ``drop[u]`` items of every row (``drop`` >= 0, <= length)."""
        lengths = self.lengths - drop
        assert (lengths >= 0).all()
        offsets = np.zeros(len(self) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        index = np.repeat(self.offsets[:-1] - offsets[:-1], lengths) + np.arange(offsets[-1])
        return Sequences(offsets, self.items[index])

    def row_ids(self) -> IntArray:
        """(nnz,) the row of every stored item."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.lengths)


@dataclass(frozen=True)
class EvalSet:
    """Held-out targets: user ``users[i]`` saw ``histories[i]`` and then ``targets[i]``.

    users: (U,) int64 row indices into ``PreparedData.sequences`` / ``IdMap.users``.
    """

    users: IntArray
    histories: Sequences
    targets: ItemArray

    def __len__(self) -> int:
        return len(self.users)


@dataclass(frozen=True)
class Split:
    """Training sequences plus validation and test targets.

    ``train`` row i belongs to user ``train_users[i]``; a model trains on next-item
    prediction inside each row.
    """

    protocol: str  # "leave_one_out" | "global_temporal"
    train: Sequences
    train_users: IntArray
    valid: EvalSet
    test: EvalSet


@dataclass(frozen=True)
class PreparedData:
    """The output of ``seqrec.data.prepare``: what models, evaluation and serving read.

    sequences: every user's full preprocessed sequence (internal ids), row = user index.
    timestamps: same layout as ``sequences.items`` (int64), or None when the source has none.
    """

    name: str  # dataset name, e.g. "ml-1m" or "synthetic"
    source: str  # where it was read from (a path, a URL or "generated")
    sequences: Sequences
    timestamps: IntArray | None
    id_map: IdMap
    split: Split

    @property
    def num_items(self) -> int:
        return len(self.id_map.items)

    @property
    def num_users(self) -> int:
        return len(self.sequences)

    def eval_set(self, split: SplitChoice) -> EvalSet:
        """The test or validation users with their histories and targets."""
        return self.split.test if split == "test" else self.split.valid

    def item_counts(self) -> IntArray:
        """(N + 1,) interactions per internal item id in the training part (index 0 unused)."""
        return np.bincount(self.split.train.items, minlength=self.num_items + 1).astype(np.int64)

    @cached_property
    def fingerprint(self) -> str:
        """sha256 of what training and evaluation read: every sequence in order and the
        split's training rows, held-out users, histories and targets. The same ids with
        other interactions (an edited log) give another fingerprint. Computed once: a run
        records it and its resume, warm start and evaluation compare with it."""
        digest = hashlib.sha256(self.split.protocol.encode())
        train, valid, test = self.split.train, self.split.valid, self.split.test
        arrays = [self.sequences.offsets, self.sequences.items, train.offsets, train.items]
        arrays.append(self.split.train_users)
        for held_out in (valid, test):
            arrays += [held_out.users, held_out.histories.offsets, held_out.histories.items]
            arrays.append(held_out.targets)
        for array in arrays:
            digest.update(np.ascontiguousarray(array, dtype=np.int64).tobytes())
        return digest.hexdigest()
