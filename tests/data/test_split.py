from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqrec.data.schema import DataError
from seqrec.data.sequences import EvalSet, Sequences
from seqrec.data.split import global_temporal, leave_one_out, time_cut


def rows(seqs: Sequences) -> list[list[int]]:
    return [seqs[i].tolist() for i in range(len(seqs))]


def as_lists(evalset: EvalSet) -> tuple[list[int], list[list[int]], list[int]]:
    return evalset.users.tolist(), rows(evalset.histories), evalset.targets.tolist()


def test_leave_one_out_hand_computed() -> None:
    seqs = Sequences.from_lists([[1, 2, 3, 4], [5, 6], [7, 8, 9]])
    split = leave_one_out(seqs)
    assert split.protocol == "leave_one_out"
    # Test history includes the validation item; user 1 (2 items) is train-only.
    assert as_lists(split.test) == ([0, 2], [[1, 2, 3], [7, 8]], [4, 9])
    assert as_lists(split.valid) == ([0, 2], [[1, 2], [7]], [3, 8])
    assert rows(split.train) == [[1, 2], [5, 6], [7]]
    assert split.train_users.tolist() == [0, 1, 2]


def test_leave_one_out_needs_a_user_with_three_items() -> None:
    with pytest.raises(DataError, match=r"no user has the 3 interactions"):
        leave_one_out(Sequences.from_lists([[1, 2], [3]]))


def test_time_cut_is_the_kth_smallest_timestamp() -> None:
    ts = np.array([9, 1, 5, 3, 7, 2, 8, 4, 6, 10])
    assert time_cut(ts, 0.7) == 8  # 7 of 10 timestamps lie below it
    assert time_cut(ts, 0.05) == 1
    assert time_cut(ts, 0.999) == 10


def test_global_temporal_hand_computed() -> None:
    seqs = Sequences.from_lists([[1, 2, 3], [4, 5, 6, 7], [8, 9, 10]])
    ts = np.array([1, 5, 9, 2, 3, 8, 10, 4, 6, 7])
    split = global_temporal(seqs, ts, 0.7)
    # Test cut t=8: users 0 and 1 have later interactions; the target is the last one and the
    # history is everything before it, including user 1's post-cut item 6 (t=8).
    assert as_lists(split.test) == ([0, 1], [[1, 2], [4, 5, 6]], [3, 7])
    # Pre-cut timestamps 1,5,2,3,4,6,7: validation cut = 4th smallest = t=5. Users 0 and 2
    # have pre-cut interactions at or after it; user 1's pre-cut part (t=2,3) is all before.
    assert as_lists(split.valid) == ([0, 2], [[1], [8, 9]], [2, 10])
    # Train: everything before t=5.
    assert rows(split.train) == [[1], [4, 5], [8]]
    assert split.train_users.tolist() == [0, 1, 2]


def test_global_temporal_without_timestamps_names_the_datasets_that_have_them() -> None:
    seqs = Sequences.from_lists([[1, 2, 3]])
    with pytest.raises(DataError, match=r"needs timestamps.*ml-100k.*synthetic.*ratings\.dat"):
        global_temporal(seqs, None, 0.9)


@st.composite
def timed_sequences(draw: st.DrawFn) -> tuple[Sequences, np.ndarray]:
    lengths = draw(st.lists(st.integers(1, 8), min_size=1, max_size=12))
    rows_, times = [], []
    for n in lengths:
        rows_.append(draw(st.lists(st.integers(1, 20), min_size=n, max_size=n)))
        times.extend(sorted(draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))))
    return Sequences.from_lists(rows_), np.array(times, dtype=np.int64)


def positions(seqs: Sequences, evalset: EvalSet) -> np.ndarray:
    """Index into ``seqs.items`` of each target (the item right after its history)."""
    return seqs.offsets[evalset.users] + evalset.histories.lengths


@settings(max_examples=80, deadline=None)
@given(timed_sequences(), st.floats(0.1, 0.95))
def test_global_temporal_never_trains_on_or_after_a_target(
    data: tuple[Sequences, np.ndarray], quantile: float
) -> None:
    seqs, ts = data
    try:
        split = global_temporal(seqs, ts, quantile)
    except DataError:
        return
    cut = time_cut(ts, quantile)
    test_pos, valid_pos = positions(seqs, split.test), positions(seqs, split.valid)
    assert (ts[test_pos] >= cut).all()
    assert (ts[valid_pos] < cut).all()
    train_max = max(
        ts[seqs.offsets[u] : seqs.offsets[u] + len(split.train[i])].max()
        for i, u in enumerate(split.train_users)
    )
    assert train_max < ts[valid_pos].min(initial=cut)
    for evalset in (split.test, split.valid):  # histories are the true prefixes
        for i, u in enumerate(evalset.users):
            n = len(evalset.histories[i])
            assert n >= 1
            assert evalset.histories[i].tolist() == seqs[u][:n].tolist()
            assert evalset.targets[i] == seqs[u][n]


@settings(max_examples=80, deadline=None)
@given(timed_sequences())
def test_leave_one_out_train_is_a_prefix_that_excludes_both_targets(
    data: tuple[Sequences, np.ndarray],
) -> None:
    seqs, _ = data
    try:
        split = leave_one_out(seqs)
    except DataError:
        return
    lengths = seqs.lengths
    assert split.test.users.tolist() == np.flatnonzero(lengths >= 3).tolist()
    assert split.train_users.tolist() == list(range(len(seqs)))
    for i, u in enumerate(split.train_users):
        expected = lengths[u] - 2 if lengths[u] >= 3 else lengths[u]
        assert split.train[i].tolist() == seqs[u][:expected].tolist()
