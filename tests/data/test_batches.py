"""Training batches: next-item labels, negatives by sampler and sharing, logQ, same-target rows."""

from __future__ import annotations

import numpy as np
import pytest

from seqrec.batch import PAD_ID, BatchNeeds
from seqrec.config import Batching
from seqrec.data.batches import (
    SeenIndex,
    TrainBatches,
    distinct_negatives,
    sample_negatives,
    target_counts,
)
from seqrec.data.sequences import Sequences

ROWS = [[1, 2, 3, 4], [2, 3], [5], [3, 1, 2, 3, 6, 2], [4, 2, 7]]
NUM_ITEMS = 9  # items 8 and 9 never occur


def make(
    needs: BatchNeeds, max_seq_len: int = 4, batch_size: int = 2, batching: Batching = "random"
) -> TrainBatches:
    sequences = Sequences.from_lists(ROWS)
    users = np.arange(len(ROWS), dtype=np.int64) + 10
    return TrainBatches(
        sequences, users, NUM_ITEMS, max_seq_len, batch_size, needs=needs, batching=batching
    )


def test_inputs_labels_and_users() -> None:
    batches = make(BatchNeeds())
    batch = batches.batch(np.array([0, 3]), np.random.default_rng(0))
    # the last 4 items before each row's last, left-padded; labels are the next items
    assert batch.input_ids.tolist() == [[0, 1, 2, 3], [1, 2, 3, 6]]
    assert batch.labels is not None
    assert batch.labels.tolist() == [[0, 2, 3, 4], [2, 3, 6, 2]]
    assert batch.users is not None
    assert batch.users.tolist() == [10, 13]
    assert batch.negatives is None
    assert batch.log_q is None
    assert batch.same_target_ids is None


@pytest.mark.parametrize("batching", ["random", "length_buckets"])
def test_an_epoch_covers_every_trainable_row_once(batching: Batching) -> None:
    batches = make(BatchNeeds(), batching=batching)
    seen = sorted(u - 10 for b in batches.epoch(np.random.default_rng(1)) for u in b.users.tolist())  # type: ignore[union-attr]
    assert seen == [0, 1, 3, 4]  # the one-item row has no target
    assert batches.num_targets == 3 + 1 + 4 + 2  # row 3 capped at max_seq_len


@pytest.mark.parametrize("sampler", ["uniform", "popularity"])
def test_negatives_per_position_avoid_the_users_items(sampler: str) -> None:
    batches = make(BatchNeeds(num_negatives=5, negative_sampler=sampler))  # type: ignore[arg-type]
    rows = np.array([0, 1, 3, 4])
    batch = batches.batch(rows, np.random.default_rng(2))
    assert batch.negatives is not None
    assert batch.labels is not None
    assert batch.negatives.shape == (4, 4, 5)
    real = batch.labels != PAD_ID
    assert (batch.negatives[~real] == PAD_ID).all()
    for b, row in enumerate(rows):
        drawn = set(batch.negatives[b][real[b]].flatten().tolist())
        assert not drawn & set(ROWS[row]), (row, drawn)


def test_shared_negatives_are_one_set_per_row() -> None:
    batches = make(BatchNeeds(num_negatives=4, shared_negatives=True))
    batch = batches.batch(np.array([0, 4]), np.random.default_rng(3))
    assert batch.negatives is not None
    assert batch.negatives.shape == (2, 4)
    assert not set(batch.negatives[0].tolist()) & set(ROWS[0])


def test_many_negatives_avoid_a_history_that_covers_most_of_the_catalogue() -> None:
    # Row 0 has seen 95 of 100 items: about 19 of 20 draws are rejected, round after round.
    num_items = 100
    sequences = Sequences.from_lists([list(range(1, 96)), [1, 2]])
    seen = SeenIndex(sequences, num_items)
    rows = np.array([0, 1, 0])
    drawn = sample_negatives(rows, (3000,), seen, num_items, np.random.default_rng(0))
    assert drawn.shape == (3, 3000)
    assert set(drawn[0].tolist()) == set(drawn[2].tolist()) == {96, 97, 98, 99, 100}
    assert not set(drawn[1].tolist()) & {1, 2}
    assert len(set(drawn[1].tolist())) == 98  # every unseen item turns up among 3,000 draws


def test_distinct_negatives_are_different_items_outside_the_window_uniformly() -> None:
    windows = np.array([[0, 0, 3, 4], [1, 2, 2, 9]])  # PAD_ID entries are no items
    rng = np.random.default_rng(0)
    counts = np.zeros((2, 11), dtype=np.int64)
    for _ in range(2000):
        drawn = distinct_negatives(windows, 4, 10, rng)
        assert drawn.shape == (2, 4)
        for row in range(2):
            assert len(set(drawn[row].tolist())) == 4
        np.add.at(counts, (np.array([[0], [1]]), drawn), 1)
    assert counts[0, [0, 3, 4]].sum() == 0
    assert counts[1, [0, 1, 2, 9]].sum() == 0
    # 4 of the 8 (row 0) or 7 (row 1) allowed items each time: 1000 and ~1143 draws apiece
    allowed_0 = counts[0, [1, 2, 5, 6, 7, 8, 9, 10]]
    allowed_1 = counts[1, [3, 4, 5, 6, 7, 8, 10]]
    assert np.abs(allowed_0 - 1000).max() < 120
    assert np.abs(allowed_1 - 8000 / 7).max() < 120
    distinct_negatives(windows, 7, 10, rng)  # every item row 1 may have
    with pytest.raises(ValueError, match="leaves only 7 of the 10 items"):
        distinct_negatives(windows, 8, 10, rng)


def test_the_distinct_sampler_avoids_the_trained_window_not_the_whole_history() -> None:
    batches = make(
        BatchNeeds(num_negatives=6, negative_sampler="distinct", shared_negatives=True),
        max_seq_len=2,
    )
    batch = batches.batch(np.array([3, 0]), np.random.default_rng(4))
    assert batch.negatives is not None
    # row 3 is [3, 1, 2, 3, 6, 2]: its window is the newest 3 items, [3, 6, 2], so item 1,
    # which the user has seen earlier, is a negative; row 0's window is [2, 3, 4]
    assert set(batch.negatives[0].tolist()) == {1, 4, 5, 7, 8, 9}
    assert set(batch.negatives[1].tolist()) == {1, 5, 6, 7, 8, 9}
    with pytest.raises(ValueError, match="at most 9 items - 3 of a training window = 6; lower"):
        make(
            BatchNeeds(num_negatives=7, negative_sampler="distinct", shared_negatives=True),
            max_seq_len=2,
        )
    # a window as long as the catalogue leaves room for none: the setting to change is named
    with pytest.raises(ValueError, match=r"= -1; no value fits: lower model.max_seq_len"):
        make(
            BatchNeeds(num_negatives=1, negative_sampler="distinct", shared_negatives=True),
            max_seq_len=9,
        )


def test_drawing_as_many_negatives_as_items_is_warned_of(caplog: pytest.LogCaptureFixture) -> None:
    make(BatchNeeds(num_negatives=NUM_ITEMS - 1))
    assert "negatives" not in caplog.text
    make(BatchNeeds(num_negatives=NUM_ITEMS))
    assert f"as the {NUM_ITEMS} items of the catalogue, so most are repeats" in caplog.text


def test_popularity_sampler_follows_target_counts() -> None:
    counts = target_counts(Sequences.from_lists(ROWS), NUM_ITEMS)
    assert counts.tolist() == [0, 1, 4, 3, 1, 0, 1, 1, 0, 0]  # first items are no targets
    # A row that contains only item 5 may get every other item: frequencies ~ counts ** 1.
    sequences = Sequences.from_lists([[5, 5], *ROWS])
    batches = TrainBatches(
        sequences,
        np.arange(len(ROWS) + 1),
        NUM_ITEMS,
        4,
        2,
        needs=BatchNeeds(num_negatives=4000, negative_sampler="popularity", shared_negatives=True),
    )
    drawn = batches.batch(np.array([0]), np.random.default_rng(4)).negatives
    assert drawn is not None
    freq = np.bincount(drawn.flatten().numpy(), minlength=NUM_ITEMS + 1) / drawn.numel()
    expected = target_counts(sequences, NUM_ITEMS).astype(float)
    expected[5] = 0.0  # the row's own item is rejected
    expected /= expected.sum()
    np.testing.assert_allclose(freq, expected, atol=0.03)
    assert freq[8] == freq[9] == 0.0


def test_log_q_is_the_log_sampling_distribution() -> None:
    needs = BatchNeeds(num_negatives=2, negative_sampler="popularity", log_q=True)
    batch = make(needs).batch(np.array([0]), np.random.default_rng(5))
    assert batch.log_q is not None
    assert batch.log_q.shape == (NUM_ITEMS + 1,)
    counts = np.array([0, 1, 4, 3, 1, 0, 1, 1, 0, 0], dtype=float)
    q = np.exp(batch.log_q.numpy())
    np.testing.assert_allclose(q[counts > 0], counts[counts > 0] / counts.sum(), rtol=1e-6)
    assert np.isfinite(batch.log_q.numpy()).all()  # never-drawn items get a finite floor


def test_in_batch_sampler_needs_no_drawn_negatives_but_gets_log_q() -> None:
    needs = BatchNeeds(negative_sampler="in_batch", log_q=True)
    batch = make(needs).batch(np.array([0, 1]), np.random.default_rng(6))
    assert batch.negatives is None
    assert batch.log_q is not None


def test_same_target_histories_precede_the_rows_last_target() -> None:
    batches = make(BatchNeeds(same_target_sequences=True), max_seq_len=3)
    rows = np.array([0, 1, 3, 4])
    sequences = Sequences.from_lists(ROWS)
    rng = np.random.default_rng(7)
    for _ in range(20):
        batch = batches.batch(rows, rng)
        assert batch.same_target_ids is not None
        for b, row in enumerate(rows):
            history = [i for i in batch.same_target_ids[b].tolist() if i != PAD_ID]
            target = ROWS[row][-1]
            assert 1 <= len(history) <= 3
            # the history is a contiguous run of some row, followed in that row by target
            assert any(
                list(seq[start : start + len(history)]) == history
                and start + len(history) < len(seq)
                and seq[start + len(history)] == target
                for seq in (sequences[r] for r in range(len(ROWS)))
                for start in range(len(seq))
            ), (row, history)


def test_same_target_avoids_the_row_itself_when_it_can() -> None:
    # row 3 ends with item 2, which also follows [1] in row 0, [3, 1] in row 3 and [4] in
    # row 4; row 4's last item 7 occurs nowhere else, so its only positive is itself
    batches = make(BatchNeeds(same_target_sequences=True))
    rng = np.random.default_rng(8)

    def positives(row: int) -> set[tuple[int, ...]]:
        out = set()
        for _ in range(40):
            ids = batches.batch(np.array([row]), rng).same_target_ids
            assert ids is not None
            out.add(tuple(i for i in ids[0].tolist() if i != PAD_ID))
        return out

    assert positives(3) == {(1,), (3, 1), (4,)}
    assert positives(4) == {(4, 2)}


def test_prefix_examples_are_every_training_position_once() -> None:
    batches = make(BatchNeeds(prefix_examples=True), max_seq_len=3, batch_size=4)
    examples = []
    for batch in batches.epoch(np.random.default_rng(5)):
        assert batch.labels is not None
        assert batch.users is not None
        assert (batch.labels[:, :-1] == PAD_ID).all()  # the label is only in the last column
        for history, label, user in zip(
            batch.input_ids.tolist(),
            batch.labels[:, -1].tolist(),
            batch.users.tolist(),
            strict=True,
        ):
            examples.append((user - 10, tuple(i for i in history if i != PAD_ID), label))
    expected = [
        (row, tuple(items[max(0, t - 3) : t]), items[t])
        for row, items in enumerate(ROWS)
        for t in range(1, len(items))
    ]
    assert sorted(examples) == sorted(expected)
    assert batches.num_targets == len(expected) == len(examples)
    assert len(batches) == -(-len(expected) // 4)


def _batch_lengths(batching: Batching, seed: int) -> list[list[int]]:
    rows = [list(range(1, n + 1)) for n in range(2, 42)]  # 40 users of lengths 2..41
    sequences = Sequences.from_lists(rows)
    users = np.arange(len(rows), dtype=np.int64)
    batches = TrainBatches(sequences, users, 50, 64, 5, batching=batching)
    epoch = batches.epoch(np.random.default_rng(seed))
    return [sorted(int(n) + 2 for n in b.users.tolist()) for b in epoch]  # type: ignore[union-attr]


def test_length_buckets_group_alike_lengths_and_random_batches_do_not() -> None:
    bucketed = _batch_lengths("length_buckets", seed=0)
    # 40 users in one bucket of 8 batches: each batch is a run of 5 consecutive lengths.
    assert all(b[-1] - b[0] == 4 for b in bucketed)
    assert sorted(n for b in bucketed for n in b) == list(range(2, 42))
    random = _batch_lengths("random", seed=0)
    assert sorted(n for b in random for n in b) == list(range(2, 42))
    assert max(b[-1] - b[0] for b in random) > 20  # mixed lengths


def windowed(max_seq_len: int, needs: BatchNeeds | None = None) -> TrainBatches:
    return TrainBatches(
        Sequences.from_lists(ROWS),
        np.arange(len(ROWS), dtype=np.int64) + 10,
        NUM_ITEMS,
        max_seq_len,
        batch_size=3,
        needs=needs or BatchNeeds(),
        windows="all",
    )


def pairs_of(batches: TrainBatches, rng_seed: int = 0) -> list[tuple[int, int, int]]:
    """(user, input item, label) for every real position of an epoch."""
    out = []
    for batch in batches.epoch(np.random.default_rng(rng_seed)):
        assert batch.labels is not None
        assert batch.users is not None
        for b, user in enumerate(batch.users.tolist()):
            for x, y in zip(batch.input_ids[b].tolist(), batch.labels[b].tolist(), strict=True):
                if y != PAD_ID:
                    out.append((user - 10, x, y))
    return out


@pytest.mark.parametrize("max_seq_len", [1, 2, 3, 4, 5, 10])
def test_all_windows_train_every_target_once_after_its_own_item(max_seq_len: int) -> None:
    batches = windowed(max_seq_len)
    expected = sorted(
        (u, row[i], row[i + 1]) for u, row in enumerate(ROWS) for i in range(len(row) - 1)
    )
    assert sorted(pairs_of(batches)) == expected
    assert batches.num_targets == len(expected) == 3 + 1 + 5 + 2
    longest = max(b.input_ids.shape[1] for b in batches.epoch(np.random.default_rng(0)))
    assert longest <= max_seq_len


def test_all_windows_are_cut_from_the_newest_item_back() -> None:
    batches = windowed(max_seq_len=2)
    rows = {}
    for batch in batches.epoch(np.random.default_rng(3)):
        assert batch.users is not None
        for b, user in enumerate(batch.users.tolist()):
            rows.setdefault(user - 10, []).append(batch.input_ids[b].tolist())
    # user 3: 3 1 2 3 6 2 -> inputs [3 6] (newest), [1 2], [0 3] (one target left over)
    assert sorted(rows[3]) == [[0, 3], [1, 2], [3, 6]]
    assert rows[1] == [[0, 2]]
    assert 2 not in rows  # a single item has no target


def test_last_window_is_the_default_and_drops_older_targets() -> None:
    batches = make(BatchNeeds(), max_seq_len=2)
    assert batches.num_targets == 2 + 1 + 2 + 2


def test_all_windows_carry_negatives_and_same_target_rows_of_their_user() -> None:
    needs = BatchNeeds(num_negatives=3, same_target_sequences=True)
    batches = windowed(max_seq_len=2, needs=needs)
    for batch in batches.epoch(np.random.default_rng(4)):
        assert batch.negatives is not None
        assert batch.users is not None
        assert batch.labels is not None
        assert batch.same_target_ids is not None
        for b, user in enumerate(batch.users.tolist()):
            real = batch.labels[b] != PAD_ID
            assert not set(batch.negatives[b][real].flatten().tolist()) & set(ROWS[user - 10])
        assert batch.same_target_ids.shape[0] == batch.input_ids.shape[0]


def strided_histories(
    max_seq_len: int, stride: int | None, parts: int = 1, world_size: int = 1
) -> dict[int, list[int]]:
    """Label -> the real inputs up to its position, for one user whose items are 1..12, over
    every rank's parts; per-position negatives must be drawn exactly at labelled cells."""
    seen: dict[int, list[int]] = {}
    for rank in range(world_size):
        batches = TrainBatches(
            Sequences.from_lists([list(range(1, 13))]),
            np.zeros(1, dtype=np.int64),
            20,  # items 13..20 are never seen: the negatives
            max_seq_len,
            batch_size=4,
            needs=BatchNeeds(num_negatives=2),
            parts=parts,
            windows="all",
            window_stride=stride,
            rank=rank,
            world_size=world_size,
        )
        assert batches.num_targets == 11
        for step in batches.steps(np.random.default_rng(0)):
            for batch in step:
                assert batch.labels is not None
                assert batch.negatives is not None
                labelled = batch.labels != PAD_ID
                assert bool((batch.negatives[labelled] > 12).all())
                assert bool((batch.negatives[~labelled] == PAD_ID).all())
                for inputs, labels in zip(
                    batch.input_ids.tolist(), batch.labels.tolist(), strict=True
                ):
                    for column, label in enumerate(labels):
                        if label != PAD_ID:
                            assert label not in seen  # each target once
                            seen[label] = [i for i in inputs[: column + 1] if i != PAD_ID]
    assert sorted(seen) == list(range(2, 13))
    return seen


@pytest.mark.parametrize("stride", [1, 2, 3, 4])
@pytest.mark.parametrize(("parts", "world_size"), [(1, 1), (2, 1), (1, 2)])
def test_strided_windows_train_each_target_once_after_most_of_its_history(
    stride: int, parts: int, world_size: int
) -> None:
    max_seq_len = 4
    for label, history in strided_histories(max_seq_len, stride, parts, world_size).items():
        before = label - 1  # items 1 .. label - 1 precede it
        assert history == list(range(label - len(history), label))  # its own newest items
        assert min(before, max_seq_len - stride + 1) <= len(history) <= min(before, max_seq_len)
        if stride == 1:  # every target sees what an example of its prefix would
            assert len(history) == min(before, max_seq_len)


def test_a_stride_of_max_seq_len_is_consecutive_windows() -> None:
    assert strided_histories(4, 4) == strided_histories(4, None)
    consecutive = strided_histories(4, None)
    assert any(len(h) < min(label - 1, 4) for label, h in consecutive.items())  # what it fixes


@pytest.mark.parametrize(("windows", "stride"), [("last", 2), ("all", 0), ("all", 5)])
def test_a_window_stride_needs_all_windows_and_at_most_max_seq_len(
    windows: str, stride: int
) -> None:
    with pytest.raises(ValueError, match="window_stride"):
        TrainBatches(
            Sequences.from_lists(ROWS),
            np.zeros(len(ROWS), dtype=np.int64),
            NUM_ITEMS,
            4,
            batch_size=2,
            windows=windows,  # type: ignore[arg-type]
            window_stride=stride,
        )


def test_prefix_examples_refuse_all_windows() -> None:
    with pytest.raises(ValueError, match="every target already"):
        windowed(max_seq_len=2, needs=BatchNeeds(prefix_examples=True))
