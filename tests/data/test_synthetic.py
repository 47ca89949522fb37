from __future__ import annotations

import itertools
from collections import Counter, defaultdict

import numpy as np
import polars as pl
import pytest

from seqrec.config import DataConfig
from seqrec.data.sequences import Sequences
from seqrec.data.split import global_temporal, time_cut
from seqrec.data.synthetic import generate, synthetic_interactions

Seq = list[int]


@pytest.fixture(scope="module")
def log() -> pl.DataFrame:
    return generate(2000, 1000, seed=0)


@pytest.fixture(scope="module")
def sequences(log: pl.DataFrame) -> list[Seq]:
    ordered = log.sort(["user_id", "timestamp"]).with_columns(pl.col("item_id").cast(pl.Int64))
    return ordered.group_by("user_id", maintain_order=True).agg("item_id")["item_id"].to_list()


def test_default_size_is_about_fifty_per_user() -> None:
    # Generation speed (about 0.3 s at this size) is a benchmark figure, not a test: a
    # wall-clock bound fails on a loaded machine.
    df = synthetic_interactions(DataConfig(dataset="synthetic"))
    assert df.columns == ["user_id", "item_id", "timestamp"]
    assert df["user_id"].n_unique() == 2000
    assert 40 <= df.height / 2000 <= 60
    assert df["item_id"].cast(pl.Int64).is_between(1, 1000).all()


def test_equal_seeds_give_equal_data_and_other_seeds_do_not() -> None:
    a, b, c = generate(97, 211, 5), generate(97, 211, 5), generate(97, 211, 6)
    assert a.equals(b)
    assert not a.equals(c)


def test_timestamps_increase_per_user_and_users_interleave(log: pl.DataFrame) -> None:
    steps = log.group_by("user_id", maintain_order=True).agg(
        pl.col("timestamp").diff().drop_nulls().min().alias("min_step"),
        pl.col("timestamp").min().alias("first"),
        pl.col("timestamp").max().alias("last"),
    )
    assert steps["min_step"].min() >= 1  # type: ignore[operator]
    # A 90% global time cut must leave many users on both sides.
    cut = time_cut(log["timestamp"].to_numpy(), 0.9)
    after = (steps["last"] >= cut).sum()
    before = (steps["first"] < cut).sum()
    assert 0.1 * 2000 < after < 0.9 * 2000
    assert before > 0.9 * 2000


def test_popularity_is_heavy_tailed(log: pl.DataFrame) -> None:
    counts = np.sort(log["item_id"].value_counts()["count"].to_numpy())[::-1]
    top_decile_share = counts[: len(counts) // 10].sum() / counts.sum()
    assert top_decile_share > 0.3  # uniform popularity would give ~0.1
    assert counts[0] > 20 * np.median(counts)


def test_some_but_not_many_repeats(sequences: list[Seq]) -> None:
    repeats = sum(len(s) - len(set(s)) for s in sequences) / sum(len(s) for s in sequences)
    assert 0.02 < repeats < 0.3


def hit_rates(sequences: list[Seq], k: int = 10) -> dict[str, float]:
    """HR@k on each user's held-out last item for popularity, first- and second-order lookups
    fitted on everything before it (second order backs off to first order when unseen)."""
    first: defaultdict[int, Counter[int]] = defaultdict(Counter)
    second: defaultdict[tuple[int, int], Counter[int]] = defaultdict(Counter)
    popularity: Counter[int] = Counter()
    for seq in sequences:
        train = seq[:-1]
        popularity.update(train)
        for a, b in itertools.pairwise(train):
            first[a][b] += 1
        for a, b, c in zip(train, train[1:], train[2:], strict=False):
            second[(a, b)][c] += 1
    top = {item for item, _ in popularity.most_common(k)}
    hits: Counter[str] = Counter()
    for seq in sequences:
        target, prev2, prev1 = seq[-1], seq[-3], seq[-2]
        one = [item for item, _ in first[prev1].most_common(k)]
        two = [item for item, _ in second[(prev2, prev1)].most_common(k)]
        two += [item for item in one if item not in two][: k - len(two)]
        hits["popularity"] += target in top
        hits["first_order"] += target in one
        hits["second_order"] += target in two
    return {name: count / len(sequences) for name, count in hits.items()}


def test_longer_context_predicts_better_than_last_item_and_popularity(
    sequences: list[Seq],
) -> None:
    hr = hit_rates(sequences)
    assert hr["first_order"] > hr["popularity"] + 0.2
    assert hr["second_order"] > hr["first_order"] + 0.05


def test_global_temporal_split_of_synthetic_data_is_nonempty(log: pl.DataFrame) -> None:
    ordered = log.sort(["user_id", "timestamp"]).with_columns(pl.col("item_id").cast(pl.Int64))
    grouped = ordered.group_by("user_id", maintain_order=True).agg("item_id", "timestamp")
    seqs = Sequences.from_lists(grouped["item_id"].to_list())
    ts = np.concatenate(grouped["timestamp"].to_list())
    split = global_temporal(seqs, ts, 0.9)
    assert len(split.test) > 100
    assert len(split.valid) > 100
    assert len(split.train) > 1500
