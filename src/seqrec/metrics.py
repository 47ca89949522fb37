"""Ranking metrics as pure functions of per-user ranks.

A rank is 0-based: the number of candidates placed above the target. Ties count against
the model: every candidate that scores *equal* to the target is placed above it
(``rank_of_target``), so a model that gives every item the same score ranks every target last.
Metrics return per-user values; averaging and confidence intervals are separate.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def rank_of_target(scores: Tensor, target: Tensor) -> Tensor:
    """0-based rank of ``target`` among ``scores``; ties count against the target, and so
    does a NaN: a NaN elsewhere ranks above the target. A target scored NaN or -inf (filtered
    out) ranks N, behind every candidate: a miss at every k <= N (last, N - 1, would be a hit
    at k = N).

    scores: (B, N) float, target: (B,) long -> (B,) long.

    >>> rank_of_target(torch.tensor([[0.1, 0.9, 0.5]]), torch.tensor([2])).tolist()
    [1]
    >>> rank_of_target(torch.tensor([[0.5, 0.5, 0.5]]), torch.tensor([0])).tolist()
    [2]
    >>> with_nan = torch.tensor([[0.1, float("nan"), float("-inf")]]).expand(3, 3)
    >>> rank_of_target(with_nan, torch.tensor([0, 1, 2])).tolist()
    [1, 3, 3]
    """
    target_score = scores.gather(1, target.unsqueeze(1))  # (B, 1)
    above = (scores >= target_score) | scores.isnan()
    never = (target_score.isnan() | (target_score == float("-inf"))).squeeze(1)
    return (above.sum(dim=1) - 1).masked_fill(never, scores.size(1))


def rank_in_topk(topk_ids: Tensor, target: Tensor, missing: int | None = None) -> Tensor:
    """Rank of ``target`` in a top-K list, or ``missing`` (default K) when it is not in it.
    (B, K), (B,) -> (B,)."""
    hits = topk_ids == target.unsqueeze(1)  # (B, K)
    first_hit = hits.long().argmax(dim=1)
    absent = topk_ids.size(1) if missing is None else missing
    return torch.where(hits.any(dim=1), first_hit, torch.full_like(first_hit, absent))


def hit_rate(ranks: Tensor, k: int) -> Tensor:
    """HR@k: 1 when the target is in the top k."""
    return (ranks < k).double()


def recall(ranks: Tensor, k: int) -> Tensor:
    """Recall@k with one relevant item per user equals HR@k."""
    return hit_rate(ranks, k)


def ndcg(ranks: Tensor, k: int) -> Tensor:
    """NDCG@k with one relevant item: IDCG = 1, so the gain is 1 / log2(rank + 2)."""
    gain = 1.0 / torch.log2(ranks.double() + 2.0)
    return torch.where(ranks < k, gain, torch.zeros_like(gain))


def mrr(ranks: Tensor, k: int) -> Tensor:
    """MRR@k: 1 / (rank + 1) inside the top k, else 0."""
    gain = 1.0 / (ranks.double() + 1.0)
    return torch.where(ranks < k, gain, torch.zeros_like(gain))


METRICS = {"HR": hit_rate, "NDCG": ndcg, "MRR": mrr, "Recall": recall}


def all_metrics(ranks: Tensor, ks: tuple[int, ...]) -> dict[str, Tensor]:
    """Per-user values of every metric at every k, keyed like ``"NDCG@10"``."""
    return {f"{name}@{k}": fn(ranks, k) for k in ks for name, fn in METRICS.items()}


def mean_and_ci(values: Tensor, z: float = 1.959964) -> tuple[float, float]:
    """Mean and the half-width of its normal-approximation 95% confidence interval."""
    n = values.numel()
    if n == 0:
        return float("nan"), float("nan")
    mean = values.double().mean().item()
    if n == 1:
        return mean, float("nan")
    std = values.double().std(unbiased=True).item()
    return mean, z * std / math.sqrt(n)
