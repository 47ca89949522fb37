"""Residual-dominance diagnostics (Kozaki et al., "Residual Dominance Drives Last-Item
Reliance in Causal Self-Attention for Sequential Recommendation", RecSys 2026; authors' code
github.com/keito0329/Residual). Numbered as in ``shared/specs/residual_dominance.md``:

1. ``last_item_hits``: HRLI@K / HRL2I@K, never filter-seen.
2. ``shuffle_histories`` + ``shuffle_evaluation``: partial and full order perturbations.
3. ``mixing_summary``: norm-based mixing ratios (``seqrec.analysis.decomposition``).
4. residual scaling: ``seqrec.analysis.hooks.residual_scale`` around any of these.
5. ``position_ranks`` + ``position_table``: the final target scored from positions L-1..L-3.
6. ``recoverable`` + ``recovery``: q(alpha) on the subset S fixed at alpha = 1.
7. ``select_alpha``: alpha* from validation under a relative HR tolerance epsilon.

Every function is batched over users (length-sorted chunks, as the evaluator does) and works
on any ``ResidualAnalyzable`` model. Ranks follow the evaluator: 0-based, ties count against
the item ranked, the padding column never counts.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from seqrec.analysis.decomposition import STAGES, Stage, contribution_norms, mixing_ratios
from seqrec.analysis.hooks import ResidualAnalyzable, padded_batches, trace_encode
from seqrec.config import EvalConfig
from seqrec.data.sequences import EvalSet, Sequences
from seqrec.evaluation import evaluate
from seqrec.metrics import rank_of_target
from seqrec.models.base import SequentialRecommender

Kind = Literal["sum", "agg"]
KINDS: tuple[Kind, ...] = ("sum", "agg")
ShuffleMode = Literal["partial", "full"]

# Datasets with repeat consumption, evaluated with seen items kept (paper, Setting). Neither
# is in the dataset registry, so a file of one's own is matched by the start of its name
# (diginetica.csv, zvuk-2023.parquet).
REPEAT_CONSUMPTION = ("diginetica", "zvuk")


def filter_seen_policy(dataset: str, run_filter_seen: bool | None = None) -> tuple[bool, str]:
    """Whether the diagnostics filter seen items, and why: never on the paper's
    repeat-consumption datasets, as the paper; otherwise as the run's own
    ``eval.filter_seen`` when given, so that alpha = 1 ranks as ``seqrec evaluate`` does,
    else on, as the paper."""
    name = Path(dataset).name.lower()
    for paper in REPEAT_CONSUMPTION:
        if name.startswith(paper):
            reason = f"the paper keeps seen items on {paper.capitalize()}, repeat consumption"
            if run_filter_seen:
                reason += "; `seqrec evaluate` filters them, as the run's eval.filter_seen says"
            return False, reason
    if run_filter_seen is None:
        return True, "the paper's rule: filtered except on repeat-consumption data"
    return run_filter_seen, "the run's eval.filter_seen, as `seqrec evaluate`"


# ----------------------------------------------------------------- 1. HRLI / HRL2I
@dataclass(frozen=True)
class LastItemHits:
    """HRLI@K and HRL2I@K over the ``num_sequences`` histories with at least two items."""

    hrli: dict[int, float]
    hrl2i: dict[int, float]
    num_sequences: int


def _history_ranks(scores: Tensor, items: Tensor) -> Tensor:
    """(B, N + 1) scores, (B,) item ids -> 0-based ranks among items 1..N (no filtering)."""
    return rank_of_target(scores[:, 1:], items - 1)


@torch.no_grad()
def last_item_hits(
    model: ResidualAnalyzable,
    eval_set: EvalSet,
    ks: Sequence[int] = (1, 10),
    *,
    max_len: int,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> LastItemHits:
    """Share of histories whose last (HRLI) / second-to-last (HRL2I) input item is in the
    model's top K. Never filter-seen: with it those items could not be recommended at all.

    Histories with one item have no second-to-last item; both rates are over the histories
    with two or more items, so the two are compared on the same sequences.
    """
    last_ranks, second_ranks = [], []
    histories = eval_set.histories
    keep = histories.lengths >= 2
    for _, input_ids in padded_batches(histories.take(np.flatnonzero(keep)), max_len, batch_size):
        scores = model.score(input_ids.to(device)).float().cpu()  # (B, N + 1)
        last_ranks.append(_history_ranks(scores, input_ids[:, -1]))
        second_ranks.append(_history_ranks(scores, input_ids[:, -2]))
    n = int(keep.sum())
    last = torch.cat(last_ranks) if last_ranks else torch.zeros(0, dtype=torch.long)
    second = torch.cat(second_ranks) if second_ranks else torch.zeros(0, dtype=torch.long)

    def rate(ranks: Tensor, k: int) -> float:
        return float((ranks < k).double().mean()) if n else float("nan")

    return LastItemHits(
        hrli={k: rate(last, k) for k in ks}, hrl2i={k: rate(second, k) for k in ks}, num_sequences=n
    )


# ----------------------------------------------------------------- 2. order perturbations
def shuffle_histories(
    histories: Sequences, max_len: int, mode: ShuffleMode, seed: int
) -> Sequences:
    """Shuffle the items the model reads (each history's last ``max_len``), seeded.

    ``partial``: the last item stays in place, the ones before it (inside the window) are
    permuted; ``full``: the whole window is permuted, last position included. Items outside
    the window and the multiset of every history are unchanged; nothing is removed.
    """
    rows = histories.row_ids()
    lengths = histories.lengths[rows]
    position = np.arange(len(histories.items)) - histories.offsets[rows]
    start = np.maximum(lengths - max_len, 0)
    end = lengths - 1 if mode == "partial" else lengths
    moved = np.flatnonzero((position >= start) & (position < end))  # sorted by row, position
    keys = np.random.default_rng(seed).random(len(moved))
    order = np.lexsort((keys, rows[moved]))  # within each row, a uniformly random order
    items = histories.items.copy()
    items[moved] = histories.items[moved[order]]
    return Sequences(histories.offsets.copy(), items)


def shuffle_evaluation(
    model: SequentialRecommender,
    eval_set: EvalSet,
    config: EvalConfig,
    *,
    all_sequences: Sequences,
    num_items: int,
    seeds: Sequence[int] = (0,),
    device: torch.device | str = "cpu",
) -> list[dict[str, float | int | str]]:
    """Metrics of the original order and of partial / full shuffles (one row per seed).

    Filter-seen (when on) removes the same items in every condition: the multiset is kept.
    """
    max_len = model.config.max_seq_len

    def row(condition: str, seed: int | None, histories: Sequences) -> dict[str, float | int | str]:
        shuffled = dataclasses.replace(eval_set, histories=histories)
        result = evaluate(
            model, shuffled, config, all_sequences=all_sequences, num_items=num_items, device=device
        )
        return {"condition": condition, "seed": -1 if seed is None else seed, **result.metrics}

    rows = [row("original", None, eval_set.histories)]
    for mode in ("partial", "full"):
        for seed in seeds:
            rows.append(row(mode, seed, shuffle_histories(eval_set.histories, max_len, mode, seed)))
    return rows


# ----------------------------------------------------------------- 3. mixing ratios
@dataclass
class MixingSummary:
    """Mixing ratios of the test histories at each stage (Attn, +Res, +LN), both kinds.

    ``mean``: pooled over every real query position of every layer and history (as the
    authors' ``summarize_mixing_ratios.py`` pools, the first position included);
    ``by_layer``: the same per layer; ``at_position[(layer, j, stage, kind)]``: histories'
    position L - j (j = 0, 1, 2) only; ``heatmaps[(layer, stage)]``: (K, K) over the last K
    positions (rows: query i, columns: source j; right-aligned), the mean over histories of
    source j's share of position i's total contribution norm sum_j' ||F_i(x_j')|| (all
    sources, not only the last K), NaN where no history reaches.
    """

    num_layers: int
    num_sequences: int
    num_positions: int  # real query positions per layer
    recent: int
    mean: dict[tuple[Stage, Kind], float] = field(default_factory=dict)
    by_layer: dict[tuple[int, Stage, Kind], float] = field(default_factory=dict)
    at_position: dict[tuple[int, int, Stage, Kind], float] = field(default_factory=dict)
    heatmaps: dict[tuple[int, Stage], npt.NDArray[np.float64]] = field(default_factory=dict)


class _Mean:
    """Running sums and counts per key (float64)."""

    def __init__(self) -> None:
        self.total: defaultdict[object, float] = defaultdict(float)
        self.count: defaultdict[object, int] = defaultdict(int)

    def add(self, key: object, values: Tensor, mask: Tensor) -> None:
        self.total[key] += float(values[mask].double().sum())
        self.count[key] += int(mask.sum())

    def get(self, key: object) -> float:
        return self.total[key] / self.count[key] if self.count[key] else float("nan")


def _recent_block(matrix: Tensor, real: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Last k x k block of (B, L, L) matrices and its valid mask (real i, real j <= i),
    left-padded to k when L < k."""
    L = matrix.size(1)
    causal = torch.ones(L, L, dtype=torch.bool, device=matrix.device).tril()
    valid = real[:, :, None] & real[:, None, :] & causal
    block, mask = matrix[:, -k:, -k:], valid[:, -k:, -k:]
    if k > L:
        pad = k - L
        block = torch.nn.functional.pad(block, (pad, 0, pad, 0))
        mask = torch.nn.functional.pad(mask, (pad, 0, pad, 0))
    return block, mask


@torch.no_grad()
def mixing_summary(
    model: ResidualAnalyzable,
    eval_set: EvalSet,
    *,
    max_len: int,
    batch_size: int = 128,
    recent: int = 15,
    device: torch.device | str = "cpu",
) -> MixingSummary:
    """Run the model over every test history with a trace and summarise the mixing ratios."""
    means = _Mean()
    heat_sum: dict[tuple[int, Stage], Tensor] = {}
    heat_count: dict[tuple[int, Stage], Tensor] = {}
    num_layers, positions = 0, 0
    for _, input_ids in padded_batches(eval_set.histories, max_len, batch_size):
        _, records, real = trace_encode(model, input_ids.to(device))
        real = real.cpu()
        num_layers = len(records)
        positions += int(real.sum())
        for layer, record in enumerate(records):
            norms = contribution_norms(record)
            for stage in STAGES:
                for kind, ratio in zip(KINDS, mixing_ratios(norms, stage), strict=True):
                    ratio = ratio.cpu()
                    means.add((stage, kind), ratio, real)
                    means.add((layer, stage, kind), ratio, real)
                    for j in range(3):
                        if ratio.size(1) > j:
                            col = ratio[:, -1 - j]
                            means.add((layer, j, stage, kind), col, real[:, -1 - j])
                matrix = norms.matrix[stage].cpu().double()
                shares = matrix / matrix.sum(dim=-1, keepdim=True).clamp_min(1e-30)
                block, mask = _recent_block(shares, real, recent)
                key = (layer, stage)
                heat_sum[key] = heat_sum.get(key, 0) + torch.where(mask, block, 0.0).sum(0)
                heat_count[key] = heat_count.get(key, 0) + mask.sum(0)
    summary = MixingSummary(num_layers, len(eval_set), positions, recent)
    for stage in STAGES:
        for kind in KINDS:
            summary.mean[(stage, kind)] = means.get((stage, kind))
            for layer in range(num_layers):
                summary.by_layer[(layer, stage, kind)] = means.get((layer, stage, kind))
                for j in range(3):
                    summary.at_position[(layer, j, stage, kind)] = means.get(
                        (layer, j, stage, kind)
                    )
    for key, total in heat_sum.items():
        count = heat_count[key]
        summary.heatmaps[key] = torch.where(
            count > 0, total / count.clamp_min(1), torch.nan
        ).numpy()
    return summary


# ----------------------------------------------------------------- 5. non-final positions
@torch.no_grad()
def position_ranks(
    model: ResidualAnalyzable,
    eval_set: EvalSet,
    offsets: Sequence[int] = (1, 2, 3),
    *,
    max_len: int,
    filter_seen: bool = True,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> npt.NDArray[np.int64]:
    """(U, P) 0-based rank of each final target scored from position L - j, j in ``offsets``.

    Position L - j reads items up to L - j only (causal), with the same history filtered as
    the evaluator filters. A history too short to have position L - j gets rank N (a miss
    at every K), as the authors' code treats it.
    """
    num_items = model.output_embedding().size(0) - 1
    out = np.full((len(eval_set), len(offsets)), num_items, dtype=np.int64)
    histories = eval_set.histories
    for chunk, input_ids in padded_batches(histories, max_len, batch_size):
        hidden, _ = model.encode(input_ids.to(device))  # (B, L, D), all positions
        table = model.output_embedding()  # (N + 1, D)
        targets = torch.from_numpy(eval_set.targets[chunk].astype(np.int64))
        sub = histories.take(chunk)
        rows = torch.from_numpy(sub.row_ids())
        cols = torch.from_numpy(sub.items.astype(np.int64))
        lengths = torch.from_numpy(np.minimum(histories.lengths[chunk], hidden.size(1)))
        for p, j in enumerate(offsets):
            if j >= hidden.size(1):
                continue
            scores = (hidden[:, -1 - j] @ table.T).float().cpu()  # (B, N + 1)
            if filter_seen:
                scores[rows, cols] = float("-inf")
            ranks = rank_of_target(scores[:, 1:], targets - 1)
            ranks = torch.where(lengths > j, ranks, num_items)
            out[chunk, p] = ranks.numpy()
    return out


def position_table(
    final_ranks: npt.NDArray[np.int64], earlier_ranks: npt.NDArray[np.int64], k: int = 10
) -> dict[str, float]:
    """Table 4: HR@k at L, and per j the share of ALL sequences where L - j hits and L misses."""
    hit_l = final_ranks < k
    row = {f"HR@{k} at L": float(hit_l.mean())}
    for p in range(earlier_ranks.shape[1]):
        row[f"L-{p + 1} hit & L miss"] = float(((earlier_ranks[:, p] < k) & ~hit_l).mean())
    return row


# ----------------------------------------------------------------- 6. conditional recovery
def recoverable(
    final_ranks: npt.NDArray[np.int64], earlier_ranks: npt.NDArray[np.int64], k: int = 10
) -> npt.NDArray[np.bool_]:
    """S: L misses (at alpha = 1) but at least one of L-1, L-2, L-3 hits. (U,) bool."""
    return (final_ranks >= k) & (earlier_ranks < k).any(axis=1)


def recovery(
    final_ranks: npt.NDArray[np.int64], subset: npt.NDArray[np.bool_], k: int = 10
) -> float:
    """q = P(L hits | S) for ranks at some alpha; NaN when S is empty. q(1) = 0 by definition."""
    if not subset.any():
        return float("nan")
    return float((final_ranks[subset] < k).mean())


# ----------------------------------------------------------------- 7. alpha selection
def select_alpha(
    alphas: Sequence[float], hr: Sequence[float], recovery_values: Sequence[float], epsilon: float
) -> float:
    """alpha* = argmax recovery(alpha) s.t. HR(alpha) >= (1 - epsilon) HR(1) (epsilon relative).

    NaN recoveries (an empty S) never win; ties go to the largest alpha, the smallest
    intervention (the authors' code takes the first, i.e. smallest, alpha among ties).

    >>> select_alpha([0.0, 0.5, 1.0], [0.10, 0.19, 0.20], [0.4, 0.3, 0.0], epsilon=0.1)
    0.5
    """
    if 1.0 not in alphas:
        raise ValueError("select_alpha: the alphas must include 1.0, the reference")
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(
            f"select_alpha: epsilon is a relative tolerance, finite and >= 0, got {epsilon}"
        )
    reference = hr[list(alphas).index(1.0)]
    best, best_recovery = 1.0, -1.0
    for alpha, h, r in sorted(zip(alphas, hr, recovery_values, strict=True), reverse=True):
        if h >= (1.0 - epsilon) * reference and r == r and r > best_recovery:
            best, best_recovery = alpha, r
    return best
