from __future__ import annotations

import logging

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqrec.data import preprocess
from seqrec.data.schema import DataError


def frame(pairs: list[tuple[str, str]], timestamps: list[int] | None = None) -> pl.DataFrame:
    data: dict[str, list[object]] = {
        "user_id": [u for u, _ in pairs],
        "item_id": [i for _, i in pairs],
    }
    if timestamps is not None:
        data["timestamp"] = list(timestamps)
    return pl.DataFrame(data, schema_overrides={"user_id": pl.String, "item_id": pl.String})


def pairs_of(df: pl.DataFrame) -> list[tuple[object, object]]:
    return list(df.select("user_id", "item_id").iter_rows())


def test_implicit_keeps_ratings_at_or_above_the_threshold_and_drops_the_column() -> None:
    df = frame([("a", "1"), ("a", "2"), ("b", "1")]).with_columns(rating=pl.Series([5.0, 3.0, 4.0]))
    out = preprocess.implicit(df, 4.0)
    assert out.columns == ["user_id", "item_id"]
    assert pairs_of(out) == [("a", "1"), ("b", "1")]
    assert preprocess.implicit(df, None).height == 3


def test_implicit_threshold_without_ratings_is_an_error() -> None:
    with pytest.raises(DataError, match=r"min_rating=4.0 is set but the data has no ratings"):
        preprocess.implicit(frame([("a", "1")]), 4.0)


def test_sort_is_stable_on_timestamp_ties() -> None:
    df = frame([("b", "x"), ("a", "1"), ("a", "2"), ("a", "3")], [0, 9, 5, 5])
    assert pairs_of(preprocess.sort_by_time(df)) == [
        ("a", "2"),  # t=5, first in the file
        ("a", "3"),  # t=5, second in the file
        ("a", "1"),  # t=9
        ("b", "x"),
    ]


def test_rows_logged_twice_are_kept_and_reported(caplog: pytest.LogCaptureFixture) -> None:
    df = frame([("a", "1"), ("a", "1"), ("a", "1"), ("a", "2"), ("b", "1")], [5, 5, 6, 5, 5])
    with caplog.at_level(logging.WARNING, logger="seqrec.data.preprocess"):
        assert preprocess.sort_by_time(df).height == 5
    assert "1 rows repeat another row's user, item and timestamp exactly" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="seqrec.data.preprocess"):
        preprocess.sort_by_time(df.filter(pl.int_range(pl.len()) != 1))
    assert "repeat" not in caplog.text  # the same item at another second is a real repeat


def test_sort_keeps_file_order_on_heavy_ties_in_a_large_frame() -> None:
    # Polars' default sort is unstable but happens to keep order on a handful of rows; a few
    # thousand rows with three timestamps and seven users expose a lost maintain_order.
    rows = 5000
    users = [f"u{i % 7}" for i in range(rows)]
    timestamps = [i % 3 for i in range(rows)]
    df = frame([(users[i], str(i)) for i in range(rows)], timestamps)
    file_order = sorted(range(rows), key=lambda i: (users[i], timestamps[i]))  # Python: stable
    expected = [(users[i], str(i)) for i in file_order]
    assert pairs_of(preprocess.sort_by_time(df)) == expected


def test_sort_without_timestamps_keeps_file_order_within_a_user() -> None:
    df = frame([("b", "9"), ("a", "3"), ("b", "1"), ("a", "2")])
    assert pairs_of(preprocess.sort_by_time(df)) == [("a", "3"), ("a", "2"), ("b", "9"), ("b", "1")]


def test_k_core_iterates_until_stable() -> None:
    # Round 1 drops items C and D (1 user each); that leaves u3 with one item, so round 2
    # drops u3; a single pass would have kept (u3, A).
    df = frame([("u1", "A"), ("u1", "B"), ("u1", "C"), ("u2", "A"), ("u2", "B"), ("u3", "A")])
    df = df.vstack(frame([("u3", "D")]))
    out = preprocess.k_core(df, 2, 2)
    assert pairs_of(out) == [("u1", "A"), ("u1", "B"), ("u2", "A"), ("u2", "B")]


def test_k_core_counts_users_and_items_separately() -> None:
    df = frame([("u1", "A"), ("u1", "B"), ("u1", "C"), ("u2", "A")])
    assert pairs_of(preprocess.k_core(df, 3, 1)) == [("u1", "A"), ("u1", "B"), ("u1", "C")]
    assert pairs_of(preprocess.k_core(df, 1, 2)) == [("u1", "A"), ("u2", "A")]


def test_k_core_that_empties_the_data_says_which_setting() -> None:
    with pytest.raises(
        DataError, match=r"'k_core' removed every interaction \(data.min_user_interactions=10"
    ):
        preprocess.k_core(frame([("a", "1"), ("a", "2")]), 10, 1)


def test_dedupe_consecutive_only_within_a_user() -> None:
    df = frame([("a", "1"), ("a", "1"), ("a", "2"), ("a", "1"), ("b", "1"), ("b", "1")])
    assert pairs_of(preprocess.dedupe_consecutive(df)) == [
        ("a", "1"),
        ("a", "2"),
        ("a", "1"),
        ("b", "1"),
    ]
    # b's first item equals a's last item: not a consecutive repeat of the same user.
    df = frame([("a", "1"), ("a", "7"), ("b", "7")])
    assert preprocess.dedupe_consecutive(df).height == 3


def test_keep_last_keeps_the_most_recent() -> None:
    df = frame([("a", str(i)) for i in range(1, 6)] + [("b", "9")])
    out = preprocess.keep_last(df, 3)
    assert pairs_of(out) == [("a", "3"), ("a", "4"), ("a", "5"), ("b", "9")]


def test_remap_orders_numeric_ids_numerically() -> None:
    df = frame([("10", "100"), ("10", "9"), ("2", "10"), ("2", "9")], [1, 2, 3, 4])
    out, id_map = preprocess.remap(df)
    assert id_map.users == ["2", "10"]
    assert id_map.items == ["9", "10", "100"]
    # Rows regrouped by internal user, time order kept inside each user.
    assert list(out.iter_rows()) == [(0, 2, 3), (0, 1, 4), (1, 3, 1), (1, 1, 2)]
    assert out.schema["item_id"] == pl.Int64


def test_remap_orders_non_numeric_ids_as_strings() -> None:
    out, id_map = preprocess.remap(frame([("u", "b"), ("u", "a10"), ("u", "a9")]))
    assert id_map.items == ["a10", "a9", "b"]
    assert out["item_id"].to_list() == [3, 1, 2]


def test_remap_keeps_contiguous_ids() -> None:
    df = frame([(str(u), str(i)) for u in range(1, 13) for i in range(1, 12) if (u + i) % 3])
    out, id_map = preprocess.remap(df)
    assert id_map.items == [str(i) for i in range(1, 12)]
    assert id_map.users == [str(u) for u in range(1, 13)]
    original = df["item_id"].cast(pl.Int64).to_list()
    assert sorted(out["item_id"].to_list()) == sorted(original)


interaction_lists = st.lists(
    st.tuples(st.integers(0, 6), st.integers(0, 8)), min_size=1, max_size=60
)


@settings(max_examples=60, deadline=None)
@given(interaction_lists, st.integers(1, 4), st.integers(1, 4))
def test_k_core_result_meets_thresholds_and_is_a_fixed_point(
    pairs: list[tuple[int, int]], min_user: int, min_item: int
) -> None:
    df = frame([(str(u), str(i)) for u, i in pairs])
    try:
        out = preprocess.k_core(df, min_user, min_item)
    except DataError:
        return  # emptied: the error path is tested above
    assert out.group_by("user_id").len()["len"].min() >= min_user  # type: ignore[operator]
    assert out.group_by("item_id").len()["len"].min() >= min_item  # type: ignore[operator]
    assert preprocess.k_core(out, min_user, min_item).equals(out)


@settings(max_examples=60, deadline=None)
@given(interaction_lists)
def test_remap_round_trips_through_the_id_map(pairs: list[tuple[int, int]]) -> None:
    df = frame([(f"u{u}", str(i * 7)) for u, i in pairs])
    out, id_map = preprocess.remap(preprocess.sort_by_time(df))
    assert out["item_id"].min() == 1
    assert out["item_id"].max() == id_map.num_items
    restored = sorted(
        zip(
            [id_map.users[u] for u in out["user_id"]],
            id_map.item_to_original(out["item_id"].to_numpy()),
            strict=True,
        )
    )
    assert restored == sorted((f"u{u}", str(i * 7)) for u, i in pairs)
