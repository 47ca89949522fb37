"""The diagnostics' pure parts by hand: HRLI/HRL2I, shuffles, non-final positions, recovery,
alpha selection, and the split note."""

from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import Tensor

from seqrec.analysis.report import ResidualOptions, split_note
from seqrec.analysis.residual import (
    filter_seen_policy,
    last_item_hits,
    position_ranks,
    position_table,
    recoverable,
    recovery,
    select_alpha,
    shuffle_histories,
)
from seqrec.config import DataConfig, EvalConfig
from seqrec.data.prepare import prepare
from seqrec.data.sequences import EvalSet, Sequences
from seqrec.evaluation import evaluate
from seqrec.models.sasrec import SASRec
from tests.analysis.conftest import tiny_sasrec


class FixedScores:
    """Every history gets the same scores: the ranks of its items are known by hand."""

    config = SimpleNamespace(max_seq_len=5)

    def __init__(self, scores: list[float]) -> None:
        self.scores = torch.tensor(scores)

    def score(self, input_ids: Tensor, users: Tensor | None = None) -> Tensor:
        return self.scores.expand(input_ids.size(0), -1)


def eval_set(rows: list[list[int]], targets: list[int] | None = None) -> EvalSet:
    return EvalSet(
        users=np.arange(len(rows), dtype=np.int64),
        histories=Sequences.from_lists(rows),
        targets=np.asarray(targets or [1] * len(rows), dtype=np.int32),
    )


def test_hrli_and_hrl2i_by_hand() -> None:
    # Items 1..7; item 7 ties item 1 (ties count against): 0-based ranks
    # item: 1->1, 7->1, 2->2, 3->3, 4->4, 5->5, 6->6.
    model = FixedScores([0.0, 5, 4, 3, 2, 1, 0, 5])
    histories = [[3, 2], [2, 1], [6, 7], [4]]  # last ranks 2, 1, 1; second 3, 2, 6; [4] left out
    hits = last_item_hits(model, eval_set(histories), (1, 2, 3), max_len=5, batch_size=2)  # type: ignore[arg-type]
    assert hits.num_sequences == 3
    assert hits.hrli == {1: 0.0, 2: pytest.approx(2 / 3), 3: 1.0}
    assert hits.hrl2i == {1: 0.0, 2: 0.0, 3: pytest.approx(1 / 3)}


def test_hrli_never_filters_the_history() -> None:
    """The last item is the best-scored item: it is a hit although the user has seen it."""
    model = FixedScores([0.0, 1, 9, 2])
    hits = last_item_hits(model, eval_set([[1, 2], [3, 2]]), (1,), max_len=5)  # type: ignore[arg-type]
    assert hits.hrli[1] == 1.0


ROWS = [list(range(1, n + 1)) for n in (1, 2, 3, 5, 9, 12)] * 20


@pytest.mark.parametrize("mode", ["partial", "full"])
def test_shuffles_keep_the_multiset_and_the_outside_of_the_window(mode: str) -> None:
    histories = Sequences.from_lists(ROWS)
    max_len = 6
    shuffled = shuffle_histories(histories, max_len, mode, seed=3)  # type: ignore[arg-type]
    np.testing.assert_array_equal(shuffled.offsets, histories.offsets)
    changed = 0
    for row in range(len(histories)):
        before, after = histories[row], shuffled[row]
        assert sorted(before) == sorted(after)  # same items, nothing removed
        outside = max(len(before) - max_len, 0)
        np.testing.assert_array_equal(after[:outside], before[:outside])
        if mode == "partial":
            assert after[-1] == before[-1]  # the last item stays in place
        changed += int((after != before).any())
    assert changed > len(histories) // 2


def test_full_shuffle_moves_the_last_item_and_seeds_are_reproducible() -> None:
    histories = Sequences.from_lists(ROWS)
    full = shuffle_histories(histories, 6, "full", seed=0)
    last = histories.offsets[1:] - 1
    assert (full.items[last] != histories.items[last]).any()
    np.testing.assert_array_equal(shuffle_histories(histories, 6, "full", seed=0).items, full.items)
    assert (shuffle_histories(histories, 6, "full", seed=1).items != full.items).any()


def test_shuffle_evaluation_evaluates_the_shuffled_histories(
    model: SASRec, monkeypatch: pytest.MonkeyPatch
) -> None:
    from seqrec.analysis import residual

    seen: list[Sequences] = []
    real_evaluate = residual.evaluate

    def recording(model: object, eval_set: EvalSet, *args: object, **kwargs: object) -> object:
        seen.append(eval_set.histories)
        return real_evaluate(model, eval_set, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(residual, "evaluate", recording)
    rows = ROWS[:12]
    held_out = eval_set(rows, targets=[1] * len(rows))
    config = EvalConfig(filter_seen=False)
    table = residual.shuffle_evaluation(
        model,
        held_out,
        config,
        all_sequences=held_out.histories,
        num_items=model.config.num_items,
        seeds=(0, 1),
    )
    assert [row["condition"] for row in table] == ["original", "partial", "partial", "full", "full"]
    max_len = model.config.max_seq_len
    np.testing.assert_array_equal(seen[0].items, held_out.histories.items)
    for histories, (mode, seed) in zip(
        seen[1:], [("partial", 0), ("partial", 1), ("full", 0), ("full", 1)], strict=True
    ):
        expected = shuffle_histories(held_out.histories, max_len, mode, seed)  # type: ignore[arg-type]
        np.testing.assert_array_equal(histories.items, expected.items)
        assert (histories.items != held_out.histories.items).any()


def test_position_zero_ranks_match_the_evaluator_and_short_histories_miss(model: SASRec) -> None:
    rows = [[1, 2, 3, 4, 5, 6], [7, 8], [9], [10, 11, 12, 13]]
    test = eval_set(rows, targets=[20, 21, 22, 23])
    ranks = position_ranks(model, test, (0, 1, 2, 3), max_len=model.config.max_seq_len)
    config = EvalConfig(protocol="full", filter_seen=True)
    all_sequences = Sequences.from_lists(
        [[*r, t] for r, t in zip(rows, [20, 21, 22, 23], strict=True)]
    )
    result = evaluate(model, test, config, all_sequences=all_sequences, num_items=37)
    np.testing.assert_array_equal(ranks[:, 0], result.ranks - 1)
    N = model.config.num_items
    assert ranks[1, 2] == N and ranks[2, 1] == N and ranks[3, 3] != N  # noqa: PT018


def test_non_final_position_reads_only_its_prefix() -> None:
    """Position L-1 of [a, b, c] is position L of [a, b]: causality (positions are counted
    from the right, so only a model without positional embedding sees the same inputs)."""
    model = tiny_sasrec(positional_embedding=False)
    long = position_ranks(model, eval_set([[4, 5, 6]], [9]), (1,), max_len=7, filter_seen=False)
    short = position_ranks(model, eval_set([[4, 5]], [9]), (0,), max_len=7, filter_seen=False)
    assert long[0, 0] == short[0, 0]


def test_position_table_recoverable_and_recovery_by_hand() -> None:
    final = np.array([0, 15, 12, 30, 11])  # L hits only for sequence 0 (k = 10)
    earlier = np.array(
        [[5, 50, 50], [3, 50, 50], [50, 50, 9], [50, 50, 50], [50, 2, 50]]
    )  # L-1 hits: 0, 1; L-2 hits: 4; L-3 hits: 2
    table = position_table(final, earlier, k=10)
    assert table == {
        "HR@10 at L": pytest.approx(0.2),
        "L-1 hit & L miss": pytest.approx(0.2),  # sequence 1 (sequence 0 hits at L)
        "L-2 hit & L miss": pytest.approx(0.2),
        "L-3 hit & L miss": pytest.approx(0.2),
    }
    subset = recoverable(final, earlier, k=10)
    np.testing.assert_array_equal(subset, [False, True, True, False, True])
    assert recovery(final, subset, k=10) == 0.0  # q(1) = 0 by definition
    at_alpha = np.array([0, 4, 40, 1, 9])  # two of the three in S now hit at L
    assert recovery(at_alpha, subset, k=10) == pytest.approx(2 / 3)
    assert np.isnan(recovery(at_alpha, np.zeros(5, dtype=bool)))


@pytest.mark.parametrize(
    ("hr", "rec", "epsilon", "expected"),
    [
        ([0.10, 0.19, 0.20], [0.4, 0.3, 0.0], 0.10, 0.5),  # 0.0 breaks the constraint
        ([0.10, 0.19, 0.20], [0.4, 0.3, 0.0], 0.60, 0.0),  # loose: the best recovery wins
        ([0.10, 0.19, 0.20], [0.4, 0.3, 0.0], 0.00, 1.0),  # strict: only alpha = 1
        ([0.20, 0.20, 0.20], [0.3, 0.3, 0.0], 0.00, 0.5),  # a tie goes to the larger alpha
        ([0.20, 0.21, 0.20], [float("nan")] * 3, 0.10, 1.0),  # empty S: nothing to recover
    ],
)
def test_select_alpha_by_hand(
    hr: list[float], rec: list[float], epsilon: float, expected: float
) -> None:
    assert select_alpha([0.0, 0.5, 1.0], hr, rec, epsilon) == expected


def test_select_alpha_needs_the_reference_and_a_relative_tolerance() -> None:
    with pytest.raises(ValueError, match=r"must include 1\.0"):
        select_alpha([0.0, 0.5], [0.1, 0.2], [0.1, 0.0], 0.1)
    with pytest.raises(ValueError, match="relative tolerance"):
        select_alpha([0.0, 1.0], [0.1, 0.2], [0.1, 0.0], -0.1)
    with pytest.raises(ValueError, match="relative tolerance, finite and >= 0, got nan"):
        select_alpha([0.0, 1.0], [0.1, 0.2], [0.1, 0.0], float("nan"))


@pytest.mark.parametrize(
    ("alphas", "message"),
    [
        ((0.0, 1.0, 1.5), "alphas: residual scales must be numbers in [0, 1], got 1.5"),
        ((-0.5, 1.0), "alphas: residual scales must be numbers in [0, 1], got -0.5"),
        ((float("nan"), 1.0), "alphas: residual scales must be numbers in [0, 1], got nan"),
        ((float("-inf"), 1.0), "alphas: residual scales must be numbers in [0, 1], got -inf"),
        ((), "alphas must include 1.0"),
        ((0.0, -0.0, 1.0), "alphas: each residual scale once, got 0 more than once"),
    ],
)
def test_residual_options_refuse_alphas_outside_the_sweep(
    alphas: tuple[float, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        ResidualOptions(alphas=alphas)


@pytest.mark.parametrize("epsilons", [(), (float("nan"),), (0.1, float("inf")), (-0.1,)])
def test_residual_options_refuse_epsilons_that_are_not_tolerances(
    epsilons: tuple[float, ...],
) -> None:
    with pytest.raises(ValueError, match="epsilons: "):
        ResidualOptions(epsilons=epsilons)


def test_filter_seen_policy_follows_the_paper_and_else_the_run() -> None:
    assert filter_seen_policy("amazon-beauty") == (
        True,
        "the paper's rule: filtered except on repeat-consumption data",
    )
    assert filter_seen_policy("ml-1m", run_filter_seen=True)[0]
    assert not filter_seen_policy("ml-1m", run_filter_seen=False)[0]  # the Mamba4Rec configs
    # neither is in the registry: the name a prepared file gets is its file name
    for name in ("diginetica", "Zvuk", "diginetica.csv", "zvuk-2023.parquet"):
        assert not filter_seen_policy(name)[0], name
    assert "`seqrec evaluate` filters them" in filter_seen_policy("diginetica.csv", True)[1]


def test_split_note_says_which_split_was_used() -> None:
    data = prepare(DataConfig(dataset="synthetic", synthetic_users=60, synthetic_items=40))
    assert "as the run was trained" in split_note(data)
    order_only = dataclasses.replace(data, timestamps=None)
    assert "has no timestamps" in split_note(order_only)
    assert "leave-one-out" in split_note(order_only)
    temporal = prepare(
        DataConfig(
            dataset="synthetic", synthetic_users=60, synthetic_items=40, split="global_temporal"
        )
    )
    assert "GTS-Last" in split_note(temporal)
