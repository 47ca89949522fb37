"""Training and evaluation batches sliced from the CSR arrays with NumPy indexing.

Nothing here loops over users or interactions in Python: a batch is a gather from
``Sequences.items`` with a left-padded index matrix.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from seqrec.batch import PAD_ID, SeqBatch
from seqrec.data.sequences import IntArray, Sequences

_BUCKET_BATCHES = 50  # batches per length-sorted bucket: less padding, still shuffled


def window(
    sequences: Sequences, rows: IntArray, max_len: int, drop_last: int = 0
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Positions in ``sequences.items`` of the most recent ``max_len`` items of each row,
    ignoring its last ``drop_last``, left-aligned to the longest window.

    Returns index (B, L) (0 where padded) and a real-item mask (B, L).
    """
    ends = sequences.offsets[rows + 1] - drop_last  # exclusive end of each window
    lengths = np.minimum(ends - sequences.offsets[rows], max_len).clip(min=0)
    L = max(int(lengths.max(initial=0)), 1)
    steps = np.arange(L) - L  # (L,): -L .. -1
    real = steps[None, :] >= -lengths[:, None]
    index = np.where(real, ends[:, None] + steps[None, :], 0)
    return index, real


def left_padded(
    sequences: Sequences, rows: IntArray, max_len: int, drop_last: int = 0
) -> npt.NDArray[np.int64]:
    """(B, L) the windows of ``window`` as item ids, PAD_ID on the left."""
    index, real = window(sequences, rows, max_len, drop_last)
    return np.where(real, sequences.items[index], PAD_ID).astype(np.int64)


class SeenIndex:
    """Membership test for (row, item) pairs of a ``Sequences``, vectorised via sorted keys."""

    def __init__(self, sequences: Sequences, num_items: int) -> None:
        self._stride = num_items + 1
        self._keys = np.unique(sequences.row_ids() * self._stride + sequences.items)

    def contains(
        self, rows: npt.NDArray[np.int64], items: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.bool_]:
        """rows and items broadcast together -> bool array of that shape."""
        keys = rows * self._stride + items
        pos = np.searchsorted(self._keys, keys).clip(max=len(self._keys) - 1)
        return self._keys[pos] == keys


def sample_negatives(
    rows: IntArray,
    shape: tuple[int, ...],
    seen: SeenIndex,
    num_items: int,
    rng: np.random.Generator,
    max_rounds: int = 64,
) -> npt.NDArray[np.int64]:
    """Items drawn uniformly from 1..N that row ``rows[b]`` never contains: (B, *shape)."""
    out = rng.integers(1, num_items + 1, size=(len(rows), *shape))
    row_grid = rows.reshape(-1, *([1] * len(shape)))
    bad = seen.contains(row_grid, out)
    for _ in range(max_rounds):  # rejection sampling; each round redraws only the rejected
        if not bad.any():
            break
        out[bad] = rng.integers(1, num_items + 1, size=int(bad.sum()))
        bad = seen.contains(np.broadcast_to(row_grid, out.shape), out)
    return out


@dataclass
class TrainBatches:
    """Next-item training batches: input = row[:-1], labels = row[1:], last max_seq_len kept.

    Each epoch shuffles users, groups them into length-sorted buckets (so a batch pads only
    to its own longest sequence) and shuffles the batch order.
    """

    sequences: Sequences
    users: IntArray  # user index of every row (models with a user embedding)
    num_items: int
    max_seq_len: int
    batch_size: int
    num_negatives: int = 0

    def __post_init__(self) -> None:
        self._rows = np.flatnonzero(self.sequences.lengths >= 2)
        self._seen = SeenIndex(self.sequences, self.num_items) if self.num_negatives else None

    def __len__(self) -> int:
        return -(-len(self._rows) // self.batch_size)

    @property
    def num_targets(self) -> int:
        """Positions with a loss per epoch (the paper's unit of an epoch)."""
        return int(np.minimum(self.sequences.lengths[self._rows] - 1, self.max_seq_len).sum())

    def epoch(self, rng: np.random.Generator) -> Iterator[SeqBatch]:
        order = rng.permutation(self._rows)
        bucket = self.batch_size * _BUCKET_BATCHES
        lengths = self.sequences.lengths
        batches: list[IntArray] = []
        for start in range(0, len(order), bucket):
            chunk = order[start : start + bucket]
            chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
            batches.extend(np.array_split(chunk, -(-len(chunk) // self.batch_size)))
        for index in rng.permutation(len(batches)):
            yield self.batch(batches[index], rng)

    def batch(self, rows: IntArray, rng: np.random.Generator) -> SeqBatch:
        index, real = window(self.sequences, rows, self.max_seq_len, drop_last=1)
        items = self.sequences.items
        inputs = np.where(real, items[index], PAD_ID).astype(np.int64)  # (B, L)
        labels = np.where(real, items[index + 1], PAD_ID).astype(np.int64)  # next items
        negatives = None
        if self._seen is not None:
            neg = sample_negatives(
                rows, (index.shape[1], self.num_negatives), self._seen, self.num_items, rng
            )
            negatives = torch.from_numpy(np.where(real[..., None], neg, PAD_ID))
        return SeqBatch(
            input_ids=torch.from_numpy(inputs),
            labels=torch.from_numpy(labels),
            negatives=negatives,
            users=torch.from_numpy(self.users[rows].astype(np.int64)),
        )
