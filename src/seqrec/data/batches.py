"""Training and evaluation batches sliced from the CSR arrays with NumPy indexing.

Nothing here loops over users or interactions in Python: a batch is a gather from
``Sequences.items`` with a left-padded index matrix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch

from seqrec.batch import PAD_ID, BatchNeeds, SeqBatch
from seqrec.config import Batching, TrainWindows, warn_once
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
    return window_between(sequences.offsets[rows], ends, max_len)


def window_between(
    starts: IntArray, ends: IntArray, max_len: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """``window`` for explicit [start, end) ranges of ``Sequences.items``."""
    lengths = np.minimum(ends - starts, max_len).clip(min=0)
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


def training_windows(
    sequences: Sequences, max_len: int, stride: int | None = None
) -> tuple[IntArray, IntArray, IntArray]:
    """Every training target of every sequence in windows of at most ``max_len`` targets,
    cut from the newest item back: (sequence, exclusive end in ``items``, targets trained) per
    window.

    A window ending at e holds targets e - max_len .. e - 1 (not before the sequence's
    second item) and their inputs, the item before each. Consecutive windows (``stride``
    None) overlap by one item and train all their targets, each target once. With ``stride``
    s < max_len a window ends every s targets and trains only its newest s (the oldest window
    trains the rest): each target is still trained once, now after at least max_len - s + 1
    items of its history where the sequence has them (s = 1: the history of RecBole's example
    per prefix), at about max_len / s times the positions computed.
    Sequences of fewer than 2 items have none.
    """
    step = max_len if stride is None else stride
    targets = np.maximum(sequences.lengths - 1, 0)
    counts = -(-targets // step)
    seqs = np.repeat(np.arange(len(targets)), counts)
    first = np.cumsum(counts) - counts  # each sequence's first window
    back = np.arange(len(seqs)) - np.repeat(first, counts)  # 0 = the newest window
    trained = np.minimum(targets[seqs] - back * step, step)
    return seqs, sequences.offsets[seqs + 1] - back * step, trained


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


ItemDraw = Callable[[np.random.Generator, int], npt.NDArray[np.int64]]


def uniform_items(num_items: int) -> ItemDraw:
    """Draws item ids uniformly from 1..N."""
    return lambda rng, n: rng.integers(1, num_items + 1, size=n)


def weighted_items(weights: npt.NDArray[np.float64]) -> ItemDraw:
    """Draws item ids with probability proportional to ``weights`` (N + 1,), by inverting
    the cumulative distribution (one binary search per draw)."""
    cdf = np.cumsum(weights / weights.sum())
    cdf[-1] = 1.0
    return lambda rng, n: np.searchsorted(cdf, rng.random(n), side="right").astype(np.int64)


def sample_negatives(
    rows: IntArray,
    shape: tuple[int, ...],
    seen: SeenIndex,
    num_items: int,
    rng: np.random.Generator,
    max_rounds: int = 1000,
    draw: ItemDraw | None = None,
) -> npt.NDArray[np.int64]:
    """Items that row ``rows[b]`` never contains, (B, *shape); uniform from 1..N unless
    ``draw`` says otherwise. Only a row that has seen (nearly) every item the draw can give
    keeps seen items after ``max_rounds`` rounds of redrawing."""
    draw = draw or uniform_items(num_items)
    per_row = int(np.prod(shape))
    out = draw(rng, len(rows) * per_row)
    row_of = np.repeat(rows, per_row)
    bad = np.flatnonzero(seen.contains(row_of, out))
    # Rejection sampling: each round redraws, and checks again, only the rejected draws, so
    # a user who has seen most of the catalogue costs rounds over a shrinking remainder.
    for _ in range(max_rounds):
        if len(bad) == 0:
            break
        out[bad] = draw(rng, len(bad))
        bad = bad[seen.contains(row_of[bad], out[bad])]
    return out.reshape(len(rows), *shape)


def distinct_negatives(
    windows: IntArray, count: int, num_items: int, rng: np.random.Generator
) -> npt.NDArray[np.int64]:
    """``count`` different items per row, uniformly without replacement from 1..N minus the
    row's ``windows`` (B, W) items (PAD_ID entries are ignored): (B, count).

    Each row ranks all N items by a uniform random key, with the window's items and padding
    keyed last, and keeps the ``count`` smallest keys.
    """
    rows = len(windows)
    keys = rng.random((rows, num_items + 1))
    keys[:, PAD_ID] = 2.0
    keys[np.arange(rows)[:, None], windows] = 2.0
    if count > num_items - windows.shape[1]:
        allowed = (keys < 2.0).sum(axis=1)
        if (allowed < count).any():
            raise ValueError(
                f"{count} distinct negatives asked for, but a training window leaves only "
                f"{int(allowed.min())} of the {num_items} items; lower model.num_negatives"
            )
    return np.argpartition(keys, count - 1, axis=1)[:, :count].astype(np.int64)


def target_counts(sequences: Sequences, num_items: int) -> npt.NDArray[np.int64]:
    """(N + 1,) how often each item is a next-item target (every item but a row's first)."""
    first = np.zeros(len(sequences.items), dtype=bool)
    first[sequences.offsets[:-1][sequences.lengths > 0]] = True
    return np.bincount(sequences.items[~first], minlength=num_items + 1).astype(np.int64)


class SameTargetIndex:
    """Finds, for a target item, a random training prefix that is followed by it (DuoRec)."""

    def __init__(self, sequences: Sequences, num_items: int) -> None:
        first = np.zeros(len(sequences.items), dtype=bool)
        first[sequences.offsets[:-1][sequences.lengths > 0]] = True
        positions = np.flatnonzero(~first)  # indices of items that are someone's target
        order = np.argsort(sequences.items[positions], kind="stable")
        self._positions = positions[order]
        self._bounds = np.searchsorted(
            sequences.items[self._positions], np.arange(num_items + 2)
        )  # occurrences of item j are _positions[_bounds[j]:_bounds[j + 1]]
        self._row_of = np.repeat(np.arange(len(sequences.lengths)), sequences.lengths)
        self._offsets = sequences.offsets

    def sample(self, targets: IntArray, avoid: IntArray, rng: np.random.Generator) -> IntArray:
        """Index in ``items`` of a random occurrence of each target, not ``avoid`` if possible.

        Returns the occurrence's index; its prefix is the history that preceded it.
        """
        lo, hi = self._bounds[targets], self._bounds[targets + 1]
        count = hi - lo
        if (count < 1).any():
            raise ValueError("a target item never occurs as a training target")
        pick = lo + (rng.random(len(targets)) * count).astype(np.int64)
        chosen = self._positions[pick]
        clash = (chosen == avoid) & (count > 1)  # step to the next occurrence instead
        pick[clash] = lo[clash] + (pick[clash] - lo[clash] + 1) % count[clash]
        return self._positions[pick]

    def prefix_bounds(self, occurrence: IntArray) -> tuple[IntArray, IntArray]:
        """[start, end) in ``items`` of the history before each occurrence."""
        return self._offsets[self._row_of[occurrence]], occurrence


@dataclass
class TrainBatches:
    """Next-item training batches: input = row[:-1], labels = row[1:], last max_seq_len kept.

    A row is a user's newest max_seq_len + 1 items, or with ``windows="all"`` one of the
    windows that together train every training target of the user once (``training_windows``,
    consecutive or every ``window_stride`` targets). Each epoch shuffles the rows into
    batches; a batch pads only to its own longest sequence.
    With ``batching="length_buckets"`` the users are sorted by length within buckets of 50
    batches first and the batch order is shuffled, which cuts padding but makes each batch's
    histories alike in length, and a batch of short histories weighs each of its positions
    more than a batch of long ones: SASRec learns measurably worse that way on ML-1M.

    With ``parts`` > 1 each batch is sorted by history length and cut into that many parts
    (``steps``), each padded to its own longest history: the same rows in each optimizer
    step, much less padding.

    ``needs`` says what else a batch carries: negatives (uniform or popularity-sampled, per
    position or per row), the log sampling probabilities for logQ correction, and
    same-target histories.

    With ``needs.prefix_examples`` an example is one training position instead of one user:
    the (up to max_seq_len) items before it as input and its item as the only label, in the
    last column.

    With ``world_size`` > 1 (data-parallel training, ``seqrec.training.distributed``) every
    rank draws the same batches and ``steps`` yields rank ``rank``'s share of each: every
    ``world_size``-th row of the batch sorted by history length, in its own ``parts``
    (nothing for a batch with fewer rows than ranks when ``rows_on_every_rank``).
    """

    sequences: Sequences
    users: IntArray  # user index of every row (models with a user embedding)
    num_items: int
    max_seq_len: int
    batch_size: int
    needs: BatchNeeds = field(default_factory=BatchNeeds)
    batching: Batching = "random"
    parts: int = 1  # each batch trained in this many length-sorted parts (see ``steps``)
    windows: TrainWindows = "last"
    # With windows="all": a window every ``window_stride`` targets, each training its newest
    # window_stride (``training_windows``); None = consecutive windows of max_seq_len.
    window_stride: int | None = None
    rank: int = 0
    world_size: int = 1
    # Every rank must have rows in every step (a loss that gathers rows over the ranks): a
    # batch with fewer rows than ranks is skipped (at most world_size - 1 rows an epoch).
    rows_on_every_rank: bool = False

    def __post_init__(self) -> None:
        if self.parts < 1:
            raise ValueError(f"parts must be >= 1, got {self.parts}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in [0, world_size = {self.world_size})")
        needs = self.needs
        if needs.prefix_examples and self.windows != "last":
            raise ValueError("prefix examples train on every target already; use windows='last'")
        if self.window_stride is not None and (
            self.windows != "all" or not 1 <= self.window_stride <= self.max_seq_len
        ):
            raise ValueError(
                f"window_stride {self.window_stride} needs windows='all' and a value in "
                f"1..max_seq_len ({self.max_seq_len})"
            )
        window_size = self.max_seq_len + 1  # a row's inputs and its newest label
        if needs.negative_sampler == "distinct" and needs.num_negatives > (
            self.num_items - window_size
        ):
            room = self.num_items - window_size
            advice = (
                f"lower model.num_negatives to {room} or less"
                if room > 0
                else "no value fits: lower model.max_seq_len below the catalogue"
            )
            raise ValueError(
                f"model.num_negatives = {needs.num_negatives} distinct negatives need at most "
                f"{self.num_items} items - {window_size} of a training window = {room}; "
                f"{advice}"
            )
        if needs.num_negatives >= self.num_items and needs.negative_sampler != "distinct":
            warn_once(
                f"model.num_negatives = {needs.num_negatives} draws (with replacement) at least "
                f"as many negatives as the {self.num_items} items of the catalogue, so most "
                "are repeats; model.loss: ce scores every item once at about the same cost"
            )
        lengths = self.sequences.lengths
        # Without prefix examples a row r is the window of ``items`` before the exclusive end
        # _window_end[r] of sequence _window_seq[r]; with windows="last" r is the sequence.
        # Row r trains its newest _window_trained[r] targets.
        self._window_seq = np.arange(len(lengths))
        self._window_end = self.sequences.offsets[1:]
        self._window_trained = np.minimum(np.maximum(lengths - 1, 0), self.max_seq_len)
        self._rows = np.flatnonzero(lengths >= 2)
        if self.windows == "all":
            self._window_seq, self._window_end, self._window_trained = training_windows(
                self.sequences, self.max_seq_len, self.window_stride
            )
            self._rows = np.arange(len(self._window_seq))
        self._row_of = np.repeat(np.arange(len(lengths)), lengths)
        if needs.prefix_examples:  # an example is the index in ``items`` of its target
            first = np.zeros(len(self.sequences.items), dtype=bool)
            first[self.sequences.offsets[:-1][lengths > 0]] = True
            self._rows = np.flatnonzero(~first)
        self._row_lengths = self._history_lengths()
        counts = target_counts(self.sequences, self.num_items)
        excludes_history = needs.num_negatives and needs.negative_sampler != "distinct"
        self._seen = SeenIndex(self.sequences, self.num_items) if excludes_history else None
        self._draw = uniform_items(self.num_items)
        weights = np.ones(self.num_items + 1)
        weights[PAD_ID] = 0.0
        if needs.negative_sampler == "popularity":
            weights = counts.astype(np.float64) ** needs.sampling_alpha * (counts > 0)
            self._draw = weighted_items(weights)
        elif needs.negative_sampler == "in_batch":  # negatives are targets: p ~ count
            weights = counts.astype(np.float64)
        self._log_q = None
        if needs.log_q:
            q = weights / weights.sum()
            # Items never drawn get a finite floor: they are never negatives, and as targets
            # (impossible for an item with no target occurrence) they must not be infinite.
            floor = q[q > 0].min() if (q > 0).any() else 1.0
            self._log_q = torch.from_numpy(np.log(np.maximum(q, floor)).astype(np.float32))
        self._same_target = (
            SameTargetIndex(self.sequences, self.num_items) if needs.same_target_sequences else None
        )

    def __len__(self) -> int:
        return -(-len(self._rows) // self.batch_size)

    @property
    def num_targets(self) -> int:
        """Positions with a loss per epoch (the paper's unit of an epoch)."""
        if self.needs.prefix_examples:
            return len(self._rows)
        return int(self._window_trained[self._rows].sum())

    def epoch(self, rng: np.random.Generator) -> Iterator[SeqBatch]:
        """The epoch's batches (the parts of each step in turn, when ``parts`` > 1)."""
        for step in self.steps(rng):
            yield from step

    def steps(
        self, rng: np.random.Generator, sample_rng: np.random.Generator | None = None
    ) -> Iterator[list[SeqBatch]]:
        """One list per optimizer step: the whole batch, or its ``parts`` length-sorted
        parts, which together hold exactly the batch's rows and positions. With several
        ranks, this rank's share of the batch (possibly empty: a list of no parts).

        ``rng`` orders the rows and must be the same on every rank; ``sample_rng`` (default
        ``rng``) draws what each batch samples (negatives, same-target histories)."""
        sample_rng = sample_rng or rng
        for rows in self._batch_rows(rng):
            if self.parts == 1 and self.world_size == 1:
                yield [self.batch(rows, sample_rng)]
                continue
            if self.rows_on_every_rank and len(rows) < self.world_size:
                continue
            by_length = rows[np.argsort(self._row_lengths[rows], kind="stable")]
            mine = by_length[self.rank :: self.world_size]
            pieces = np.array_split(mine, min(self.parts, len(mine))) if len(mine) else []
            yield [self.batch(piece, sample_rng) for piece in pieces]

    def _history_lengths(self) -> IntArray:
        """Each row's length to sort by: the items up to its window's end (the user's whole
        sequence with windows="last"), or an example's history length."""
        if not self.needs.prefix_examples:
            return self._window_end - self.sequences.offsets[self._window_seq]
        lengths = np.zeros(len(self.sequences.items), dtype=np.int64)
        lengths[self._rows] = self._rows - self.sequences.offsets[self._row_of[self._rows]]
        return lengths

    def _batch_rows(self, rng: np.random.Generator) -> Iterator[IntArray]:
        order = rng.permutation(self._rows)
        if self.batching == "random":
            for start in range(0, len(order), self.batch_size):
                yield order[start : start + self.batch_size]
            return
        bucket = self.batch_size * _BUCKET_BATCHES
        batches: list[IntArray] = []
        lengths = self._row_lengths
        for start in range(0, len(order), bucket):
            chunk = order[start : start + bucket]
            chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
            batches.extend(np.array_split(chunk, -(-len(chunk) // self.batch_size)))
        for index in rng.permutation(len(batches)):
            yield batches[index]

    def batch(self, rows: IntArray, rng: np.random.Generator) -> SeqBatch:
        if self.needs.prefix_examples:
            return self._prefix_batch(rows, rng)
        seqs, ends = self._window_seq[rows], self._window_end[rows]
        index, real = window_between(self.sequences.offsets[seqs], ends - 1, self.max_seq_len)
        items = self.sequences.items
        inputs = np.where(real, items[index], PAD_ID).astype(np.int64)  # (B, L)
        labels = np.where(real, items[index + 1], PAD_ID).astype(np.int64)  # next items
        if self.window_stride is not None:  # older targets train in their own windows
            older = np.arange(labels.shape[1]) < labels.shape[1] - self._window_trained[rows, None]
            labels[older] = PAD_ID
        return SeqBatch(
            input_ids=torch.from_numpy(inputs),
            labels=torch.from_numpy(labels),
            negatives=self._negatives(seqs, inputs, labels, rng),
            users=torch.from_numpy(self.users[seqs].astype(np.int64)),
            log_q=self._log_q,
            same_target_ids=self._same_target_histories(ends - 1, rng),
        )

    def _prefix_batch(self, targets: IntArray, rng: np.random.Generator) -> SeqBatch:
        """Examples given by the index in ``items`` of their target."""
        rows = self._row_of[targets]
        index, real = window_between(self.sequences.offsets[rows], targets, self.max_seq_len)
        items = self.sequences.items
        inputs = np.where(real, items[index], PAD_ID).astype(np.int64)  # (B, L)
        labels = np.zeros_like(inputs)
        labels[:, -1] = items[targets]
        return SeqBatch(
            input_ids=torch.from_numpy(inputs),
            labels=torch.from_numpy(labels),
            negatives=self._negatives(rows, inputs, labels, rng),
            users=torch.from_numpy(self.users[rows].astype(np.int64)),
            log_q=self._log_q,
            same_target_ids=self._same_target_histories(targets, rng),
        )

    def _negatives(
        self, rows: IntArray, inputs: IntArray, labels: IntArray, rng: np.random.Generator
    ) -> torch.Tensor | None:
        """Negatives of a batch of ``rows`` with (B, L) ``inputs`` and ``labels``."""
        S = self.needs.num_negatives
        if S and self.needs.negative_sampler == "distinct":  # (B, S), none from the window
            window = np.hstack([inputs, labels])  # the row's trained items, PAD_ID elsewhere
            return torch.from_numpy(distinct_negatives(window, S, self.num_items, rng))
        if self._seen is None:
            return None
        if self.needs.shared_negatives:  # (B, S)
            return torch.from_numpy(
                sample_negatives(rows, (S,), self._seen, self.num_items, rng, draw=self._draw)
            )
        labelled = labels != PAD_ID  # only these cells are drawn for (strided windows: few)
        neg = np.full((*labels.shape, S), PAD_ID, dtype=np.int64)
        per_cell = np.repeat(rows, labelled.sum(axis=1))
        neg[labelled] = sample_negatives(
            per_cell, (S,), self._seen, self.num_items, rng, draw=self._draw
        )
        return torch.from_numpy(neg)

    def _same_target_histories(
        self, last: IntArray, rng: np.random.Generator
    ) -> torch.Tensor | None:
        """(B, L') for each target occurrence ``last`` (its index in ``items``), another
        training history followed by the same item."""
        if self._same_target is None:
            return None
        targets = self.sequences.items[last].astype(np.int64)
        occurrence = self._same_target.sample(targets, last, rng)
        starts, ends = self._same_target.prefix_bounds(occurrence)
        index, real = window_between(starts, ends, self.max_seq_len)
        ids = np.where(real, self.sequences.items[index], PAD_ID).astype(np.int64)
        return torch.from_numpy(ids)
