"""Paired comparison of two models on the same test users, from their exported ranks.

Two runs evaluated on one split rank the same target for each user, so their difference is
measured per user: the mean of the per-user metric differences, its standard error, and a
seeded bootstrap interval over users. This is much tighter than comparing the two runs'
separate confidence intervals, because most of the per-user variance is shared. It covers
the test users, not training randomness: one run per model is still one seed.

Rank files are what ``seqrec evaluate --export-ranks`` writes: ``user_id``, ``target``,
1-based ``rank`` (empty where a generative model's top-K list does not hold the target) and
``protocol``; files of two protocols are not compared, nor cut-offs beyond a list.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import torch

from seqrec.evaluation import RANK_COLUMNS
from seqrec.metrics import METRICS, mean_and_ci


@dataclass(frozen=True)
class PairedDifference:
    metric: str
    mean_a: float
    mean_b: float
    difference: float  # mean over users of (A - B)
    standard_error: float
    z: float  # difference / standard_error
    ci_low: float  # bootstrap percentile interval of the difference, 95%
    ci_high: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_ranks(path: str | Path) -> pl.DataFrame:
    """A rank file as (user_id, target, rank), user ids and targets as strings."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a rank file")
    if not path.is_file():
        raise ValueError(f"rank file {path} does not exist")
    try:
        frame = pl.read_parquet(path) if path.suffix.lower() == ".parquet" else pl.read_csv(path)
    except (pl.exceptions.PolarsError, OSError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]  # not Polars' advice
        raise ValueError(f"{path} is not a readable rank file: {reason}") from None
    missing = [c for c in RANK_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(
            f"{path} lacks column(s) {', '.join(missing)}; rank files come from "
            "`seqrec evaluate RUN --export-ranks FILE`"
        )
    ranks = frame["rank"]
    frame = frame.select(
        pl.col("user_id").cast(pl.String),
        pl.col("target").cast(pl.String),
        pl.col("rank").cast(pl.Int64, strict=False),
        (pl.col("protocol") if "protocol" in frame.columns else pl.lit(None))
        .cast(pl.String)
        .alias("protocol"),
    )
    if frame["rank"].null_count() > ranks.null_count() or (frame["rank"] < 1).any():
        raise ValueError(f"{path}: every rank must be an integer >= 1 (or empty: not listed)")
    if frame["user_id"].is_duplicated().any():
        raise ValueError(f"{path}: a user appears more than once")
    if frame["protocol"].n_unique() > 1:
        raise ValueError(f"{path}: its rows name more than one protocol")
    return frame


def aligned_ranks(a: pl.DataFrame, b: pl.DataFrame) -> tuple[torch.Tensor, torch.Tensor]:
    """0-based ranks of the same users in both files, in one order; refuses files that rank
    different users or different targets (different splits or datasets)."""
    joined = a.join(b, on="user_id", how="full", suffix="_b", coalesce=True)
    only_one = joined.filter(pl.col("target").is_null() | pl.col("target_b").is_null()).height
    if only_one:
        raise ValueError(
            f"the rank files rank different users ({only_one} in one file only): evaluate both "
            "runs on the same dataset and split"
        )
    differ = joined.filter(pl.col("target") != pl.col("target_b")).height
    if differ:
        raise ValueError(
            f"the rank files have different targets for {differ} users: evaluate both runs on "
            "the same dataset and split"
        )
    protocols = {p for p in (a["protocol"][0], b["protocol"][0]) if p is not None}
    if len(protocols) > 1:
        first, second = a["protocol"][0], b["protocol"][0]
        raise ValueError(
            f"the rank files come from different protocols (A: {first}; B: {second}): "
            "evaluate both runs with the same one"
        )
    joined = joined.sort("user_id")
    return _zero_based(joined["rank"]), _zero_based(joined["rank_b"])


_NOT_LISTED = np.iinfo(np.int64).max // 2  # a 0-based rank no cut-off reaches


def _zero_based(ranks: pl.Series) -> torch.Tensor:
    """0-based ranks; a target outside a generative model's list ranks beyond every k."""
    return torch.from_numpy(ranks.fill_null(_NOT_LISTED + 1).to_numpy() - 1)


def check_cut_offs(frame: pl.DataFrame, ks: tuple[int, ...], name: str) -> None:
    """Refuse a k beyond a generative model's list: a target outside it may rank anywhere
    after it. The list holds at least the largest rank any user has."""
    if frame["rank"].null_count() == 0:
        return
    listed = int(frame["rank"].fill_null(0).to_numpy().max())
    if max(ks) > listed:
        raise ValueError(
            f"rank file {name} ranks the targets only within a model's top-K list (its "
            f"largest rank is {listed}, and some targets are not listed): compare at "
            f"k <= {listed}, or evaluate that run with a larger eval.ks"
        )


def _bootstrap_means(
    differences: npt.NDArray[np.float64], samples: int, seed: int
) -> npt.NDArray[np.float64]:
    """(M, U) per-user differences of M metrics -> (samples, M) means over resampled users;
    every metric is averaged over the same resamples."""
    rng = np.random.default_rng(seed)
    users = differences.shape[1]
    return np.stack(
        [differences[:, rng.integers(0, users, users)].mean(axis=1) for _ in range(samples)]
    )


def paired_differences(
    a: pl.DataFrame,
    b: pl.DataFrame,
    ks: tuple[int, ...] = (10,),
    *,
    bootstrap: int = 2000,
    seed: int = 0,
) -> list[PairedDifference]:
    """A - B for HR, NDCG and MRR at each k, over the users both files rank."""
    if bootstrap < 1:
        raise ValueError(f"bootstrap must be >= 1, got {bootstrap}")
    if not ks or min(ks) < 1:
        raise ValueError(f"the cut-offs k must be >= 1, got {list(ks)}")
    if len(set(ks)) < len(ks):
        raise ValueError(f"each cut-off k once, got {list(ks)}")
    if seed < 0:
        raise ValueError(f"the bootstrap seed must be >= 0, got {seed}")
    check_cut_offs(a, ks, "A")
    check_cut_offs(b, ks, "B")
    ranks_a, ranks_b = aligned_ranks(a, b)
    if len(ranks_a) < 2:
        raise ValueError("a paired comparison needs at least two users")
    cut_offs = [(name, k) for k in ks for name in ("HR", "NDCG", "MRR")]
    per_a = np.stack([METRICS[name](ranks_a, k).numpy() for name, k in cut_offs])  # (M, U)
    per_b = np.stack([METRICS[name](ranks_b, k).numpy() for name, k in cut_offs])
    differences = per_a - per_b  # (M, U)
    low, high = np.percentile(_bootstrap_means(differences, bootstrap, seed), [2.5, 97.5], axis=0)
    out = []
    for m, (name, k) in enumerate(cut_offs):
        mean, error = mean_and_ci(torch.from_numpy(differences[m]), z=1.0)  # z=1: standard error
        out.append(
            PairedDifference(
                metric=f"{name}@{k}",
                mean_a=float(per_a[m].mean()),
                mean_b=float(per_b[m].mean()),
                difference=mean,
                standard_error=error,
                z=mean / error if error > 0 else 0.0,
                ci_low=float(low[m]),
                ci_high=float(high[m]),
            )
        )
    return out
