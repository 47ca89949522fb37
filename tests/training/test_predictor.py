"""``Predictor.from_run_dir``: batches, seen items, oversized k and unknown ids."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from seqrec.config import ConfigError
from seqrec.serving.predictor import Predictor, Recommendation, top_items
from tests.cli.helpers import tiny_raw, train_isolated


@pytest.fixture(scope="module")
def predictor(tiny_run: Path) -> Predictor:
    return Predictor.from_run_dir(tiny_run)


@pytest.fixture(scope="module")
def items(predictor: Predictor) -> list[str]:
    return list(predictor.id_map.items)


def histories(items: list[str]) -> list[list[str]]:
    """Different lengths (1 to past max_seq_len = 20), repeats, unknown ids, odd orders."""
    return [
        items[:1],
        items[5:12],
        [items[3], items[3], items[50], items[3]],
        ["unknown-1", *items[100:104], "unknown-2"],
        items[::-1][:19],
        items[7:30],
        items[::4],
    ]


def one_at_a_time(
    predictor: Predictor, batch: list[list[str]], k: int, exclude_seen: bool
) -> list[Recommendation]:
    return [predictor.recommend([h], k, exclude_seen)[0] for h in batch]


def assert_same(a: list[Recommendation], b: list[Recommendation]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.items == y.items
        assert x.unknown == y.unknown
        assert x.error == y.error
        assert x.scores == pytest.approx(y.scores, abs=1e-5)


@pytest.mark.parametrize("exclude_seen", [True, False])
def test_batch_equals_one_at_a_time(
    predictor: Predictor, items: list[str], exclude_seen: bool
) -> None:
    batch = histories(items)
    together = predictor.recommend(batch, 10, exclude_seen)
    assert all(len(r.items) == 10 for r in together)
    assert_same(together, one_at_a_time(predictor, batch, 10, exclude_seen))


def test_batch_equals_one_at_a_time_when_k_exceeds_the_unseen_items(
    predictor: Predictor, items: list[str]
) -> None:
    batch = [items[:2], items[10:20]]
    k = len(items)
    assert_same(predictor.recommend(batch, k), one_at_a_time(predictor, batch, k, True))


@pytest.mark.parametrize("k", [10, 500])
def test_never_recommends_history_items(predictor: Predictor, items: list[str], k: int) -> None:
    batch = histories(items)
    short = [h for h in batch if len([i for i in h if i in items]) <= predictor.max_seq_len]
    assert len(short) >= 5
    for history, rec in zip(short, predictor.recommend(short, k), strict=True):
        assert rec.items, history
        assert not set(rec.items) & set(history), history


def test_never_recommends_items_from_a_history_longer_than_max_seq_len(
    predictor: Predictor, items: list[str]
) -> None:
    history = items[:60]  # max_seq_len is 20
    (rec,) = predictor.recommend([history], k=len(items))
    assert not set(rec.items) & set(history)


def test_k_larger_than_the_catalogue(predictor: Predictor, items: list[str]) -> None:
    history = [items[4], items[9], items[4]]
    (rec,) = predictor.recommend([history], k=10 * len(items))
    assert len(rec.items) == len(set(rec.items))
    assert set(rec.items) == set(items) - set(history)
    assert rec.scores is not None
    assert len(rec.scores) == len(rec.items)
    assert rec.scores == sorted(rec.scores, reverse=True)

    (kept,) = predictor.recommend([history], k=10 * len(items), exclude_seen=False)
    assert sorted(kept.items) == sorted(items)


def test_unknown_ids_are_reported_per_history(predictor: Predictor, items: list[str]) -> None:
    batch = [
        [items[0], "x1", items[1]],
        [items[2]],
        ["x2", "x3"],
        [],
        ["x4", items[3], "x4"],
    ]
    recs = predictor.recommend(batch, k=5)
    assert [r.unknown for r in recs] == [["x1"], [], ["x2", "x3"], [], ["x4"]]  # each once
    assert [r.error for r in recs] == [
        None,
        None,
        "no known item in the history",
        "empty history",
        None,
    ]
    assert [len(r.items) for r in recs] == [5, 5, 0, 0, 5]
    assert recs[2].scores is None
    assert recs[0].items == predictor.recommend([[items[0], items[1]]], k=5)[0].items


def test_k_must_be_positive(predictor: Predictor, items: list[str]) -> None:
    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        predictor.recommend([items[:3]], k=0)


def test_a_history_given_as_a_string_is_refused(predictor: Predictor, items: list[str]) -> None:
    """Its characters would otherwise be read as item ids, one history per character (bytes:
    their values; a set has no order)."""
    for history in (items[0], items[0].encode(), set(items[:2]), None, 7):
        with pytest.raises(TypeError, match="a history must be a list of item ids, oldest first"):
            predictor.recommend([history], k=3)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="a history must be a list of item ids"):
        predictor.recommend(f"{items[0]} {items[1]}", k=3)
    as_array = predictor.recommend([np.array(items[:3])], k=3)  # an array of ids is a history
    assert as_array == predictor.recommend([items[:3]], k=3)
    for k in (2.5, True, "3", None):
        with pytest.raises(TypeError, match="k must be an int"):
            predictor.recommend([items[:3]], k=k)  # type: ignore[arg-type]
    assert predictor.recommend([items[:3]], k=np.int64(3)) == predictor.recommend([items[:3]], 3)
    for exclude_seen in ("no", 0, None):  # "no" was read as True
        with pytest.raises(TypeError, match="exclude_seen must be True or False"):
            predictor.recommend([items[:3]], exclude_seen=exclude_seen)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"inference settings must be a mapping .*\[\('depth'"):
        predictor.recommend([items[:3]], settings=[("depth", 3)])  # type: ignore[arg-type]


def test_a_model_of_training_users_cannot_rank_a_history(tmp_path: Path) -> None:
    run = train_isolated(
        tiny_raw(model={"name": "bpr", "hidden_size": 8}, train={"max_epochs": 1}),
        tmp_path / "run",
        tmp_path / "cache",
    )
    predictor = Predictor.from_run_dir(run)
    with pytest.raises(ValueError, match="bpr scores each training user by the embedding"):
        predictor.recommend([list(predictor.id_map.items[:2])], k=3)


def test_nan_scores_are_an_error_for_histories_and_sessions_alike() -> None:
    """``top_items`` serves both: a NaN once left its item out, and an all-NaN row empty."""
    scores = torch.tensor([[0.0, 0.3, float("nan"), 0.1]])
    with pytest.raises(ValueError, match="the model scored items NaN"):
        top_items(scores, None, 2)
    assert top_items(torch.tensor([[0.0, 0.3, 0.2, 0.1]]), None, 2)[0][0] == [1, 2]
