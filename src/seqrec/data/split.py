"""Train / validation / test splits over the CSR arrays; vectorised, no loop over users.

``leave_one_out`` (SASRec, Mamba4Rec, RecRec, TrieRec): for a user with n >= 3 items,
test = item n with history items 1..n-1 (which includes the validation item), validation
= item n-1 with history 1..n-2, train = items 1..n-2. Users with fewer than 3 items go to
training whole and are never evaluated, as in the SASRec reference code.

``global_temporal`` (GTS-Last, residual-dominance paper): the cut is the timestamp below
which a ``quantile`` share of all interactions lies (``t_cut`` = the k-th smallest
timestamp, k = floor(quantile * nnz); interactions with ``t < t_cut`` are "before").
Test users are those with an interaction at or after the cut; the target is their last
interaction and the history is everything before it, including earlier post-cut items.
Validation repeats this inside the pre-cut part with a second cut at the same quantile of
the pre-cut timestamps; train is everything before that second cut. A user whose target
would have an empty history is not evaluated. Sequences must be sorted by time within
a user (``preprocess.sort_by_time``), so "before a cut" is a prefix of each row.
"""

from __future__ import annotations

import logging

import numpy as np

from seqrec.config import SplitName
from seqrec.data.datasets import datasets_with_timestamps
from seqrec.data.schema import DataError
from seqrec.data.sequences import EvalSet, IntArray, Sequences, Split

logger = logging.getLogger(__name__)


def _eval_set(sequences: Sequences, users: IntArray, keep: IntArray) -> EvalSet:
    """Target = item ``keep[i]`` of row ``users[i]`` (0-based), history = the items before it."""
    rows = sequences.take(users)
    targets = rows.items[rows.offsets[:-1] + keep]
    histories = rows.truncate_end(rows.lengths - keep)
    return EvalSet(users=users, histories=histories, targets=targets)


def _prefix(sequences: Sequences, keep: IntArray) -> tuple[Sequences, IntArray]:
    """The first ``keep[u]`` items of every row with ``keep[u] >= 1``, and those rows."""
    users = np.flatnonzero(keep >= 1).astype(np.int64)
    rows = sequences.take(users)
    return rows.truncate_end(rows.lengths - keep[users]), users


def leave_one_out(sequences: Sequences) -> Split:
    """Last item = test, second last = validation, the rest = train (see module docstring)."""
    lengths = sequences.lengths
    evaluated = np.flatnonzero(lengths >= 3).astype(np.int64)
    if len(evaluated) == 0:
        raise DataError("leave_one_out: no user has the 3 interactions it needs")
    n = lengths[evaluated]
    test = _eval_set(sequences, evaluated, n - 1)
    valid = _eval_set(sequences, evaluated, n - 2)
    train_len = np.where(lengths >= 3, lengths - 2, lengths)
    train, train_users = _prefix(sequences, train_len)
    _log("leave_one_out", train, valid, test)
    return Split("leave_one_out", train, train_users, valid, test)


def time_cut(timestamps: IntArray, quantile: float) -> int:
    """The k-th smallest timestamp, k = floor(quantile * n): about ``quantile`` lie below it."""
    k = min(int(quantile * len(timestamps)), len(timestamps) - 1)
    return int(np.partition(timestamps, k)[k])


def _count_before(sequences: Sequences, timestamps: IntArray, cut: int) -> IntArray:
    return np.bincount(sequences.row_ids()[timestamps < cut], minlength=len(sequences)).astype(
        np.int64
    )


def global_temporal(sequences: Sequences, timestamps: IntArray | None, quantile: float) -> Split:
    """GTS with GTS-Last targets for test and validation (see module docstring)."""
    if timestamps is None:
        raise DataError(
            "split: global_temporal needs timestamps and this data has none; datasets with "
            f"timestamps: {', '.join(datasets_with_timestamps())} (ml-1m only when read from "
            "GroupLens ratings.dat), or a file with data.timestamp_column"
        )
    assert len(timestamps) == len(sequences.items)
    lengths = sequences.lengths
    cut = time_cut(timestamps, quantile)
    before = _count_before(sequences, timestamps, cut)
    test_users = np.flatnonzero((lengths > before) & (lengths >= 2)).astype(np.int64)
    if len(test_users) == 0:
        raise DataError(f"global_temporal: no user has interactions after the cut t={cut}")
    test = _eval_set(sequences, test_users, lengths[test_users] - 1)

    pre_cut = timestamps < cut
    valid_cut = time_cut(timestamps[pre_cut], quantile) if pre_cut.any() else cut
    before_valid = _count_before(sequences, timestamps, valid_cut)
    valid_users = np.flatnonzero((before > before_valid) & (before >= 2)).astype(np.int64)
    valid = _eval_set(sequences, valid_users, before[valid_users] - 1)

    train, train_users = _prefix(sequences, before_valid)
    if len(train_users) == 0:
        raise DataError(f"global_temporal: nothing lies before the validation cut t={valid_cut}")
    logger.info("global_temporal: test cut t=%d, validation cut t=%d", cut, valid_cut)
    _log("global_temporal", train, valid, test)
    return Split("global_temporal", train, train_users, valid, test)


def make_split(
    protocol: SplitName, sequences: Sequences, timestamps: IntArray | None, quantile: float
) -> Split:
    """Dispatch on ``DataConfig.split``."""
    if protocol == "leave_one_out":
        return leave_one_out(sequences)
    return global_temporal(sequences, timestamps, quantile)


def _log(protocol: str, train: Sequences, valid: EvalSet, test: EvalSet) -> None:
    logger.info(
        "%s: train users=%d interactions=%d, valid users=%d, test users=%d",
        protocol,
        len(train),
        len(train.items),
        len(valid),
        len(test),
    )
