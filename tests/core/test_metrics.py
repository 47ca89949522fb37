"""Metrics by hand and by property."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seqrec.metrics import (
    all_metrics,
    hit_rate,
    mean_and_ci,
    mrr,
    ndcg,
    rank_in_topk,
    rank_of_target,
)


def test_hand_computed_values() -> None:
    ranks = torch.tensor([0, 1, 4, 9, 10])  # 0-based
    assert hit_rate(ranks, 10).tolist() == [1, 1, 1, 1, 0]
    assert hit_rate(ranks, 5).tolist() == [1, 1, 1, 0, 0]
    expected = [1.0, 1 / math.log2(3), 1 / math.log2(6), 1 / math.log2(11), 0.0]
    torch.testing.assert_close(ndcg(ranks, 10), torch.tensor(expected, dtype=torch.float64))
    torch.testing.assert_close(
        mrr(ranks, 10), torch.tensor([1, 1 / 2, 1 / 5, 1 / 10, 0.0], dtype=torch.float64)
    )


def test_ties_count_against_the_model() -> None:
    scores = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 2.0, 1.0, 1.0]])
    assert rank_of_target(scores, torch.tensor([0, 2])).tolist() == [2, 2]


def test_rank_in_topk_marks_misses_with_k() -> None:
    topk = torch.tensor([[5, 3, 9], [1, 2, 4]])
    assert rank_in_topk(topk, torch.tensor([9, 7])).tolist() == [2, 3]


def test_confidence_interval() -> None:
    mean, half = mean_and_ci(torch.tensor([0.0, 1.0, 0.0, 1.0]))
    assert mean == 0.5
    assert math.isclose(half, 1.959964 * math.sqrt(1 / 3) / 2, rel_tol=1e-6)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=500), min_size=1, max_size=50), st.integers(1, 50)
)
def test_metric_order_property(ranks: list[int], k: int) -> None:
    r = torch.tensor(ranks)
    assert ((mrr(r, k) >= 0) & (mrr(r, k) <= ndcg(r, k)) & (ndcg(r, k) <= hit_rate(r, k))).all()
    assert (hit_rate(r, k) <= 1).all()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-5, 5), min_size=2, max_size=30), st.data())
def test_full_rank_agrees_with_topk_rank(values: list[int], data: st.DataObject) -> None:
    scores = torch.tensor([values], dtype=torch.float32)
    target = data.draw(st.integers(0, len(values) - 1))
    rank = rank_of_target(scores, torch.tensor([target])).item()
    # A pessimistic top-k: among ties, the target comes last.
    key = scores[0] * 2 - (torch.arange(len(values)) == target).float()
    order = key.argsort(descending=True)
    assert rank_in_topk(order.unsqueeze(0), torch.tensor([target])).item() == rank


def test_all_metrics_names() -> None:
    names = set(all_metrics(torch.tensor([0, 3]), (5, 10)))
    assert names == {f"{m}@{k}" for m in ("HR", "NDCG", "MRR", "Recall") for k in (5, 10)}
