"""Preprocessing steps: pure ``df -> df`` functions over the canonical interaction frame.

Applied in this order by ``seqrec.data.prepare``: ``implicit`` -> ``sort_by_time`` ->
``k_core`` -> ``dedupe_consecutive`` -> ``keep_last`` -> ``remap``. Each step logs the row,
user and item counts after it, and a step that removes every interaction raises a
``DataError`` naming itself and the setting responsible.

Steps after ``sort_by_time`` assume its output: each user's rows are contiguous and in
time order (file order on timestamp ties, or file order when there are no timestamps).
"""

from __future__ import annotations

import logging

import polars as pl

from seqrec.data.idmap import IdMap
from seqrec.data.schema import ITEM_ID, RATING, TIMESTAMP, USER_ID, DataError

logger = logging.getLogger(__name__)


def log_counts(step: str, df: pl.DataFrame) -> None:
    """Log rows, users and items after ``step`` (INFO)."""
    if df.height == 0:
        logger.info("%-18s rows=0", step)
        return
    users, items = df.select(pl.col(USER_ID).n_unique(), pl.col(ITEM_ID).n_unique()).row(0)
    logger.info("%-18s rows=%d users=%d items=%d", step, df.height, users, items)


def _checked(step: str, setting: str, before: pl.DataFrame, after: pl.DataFrame) -> pl.DataFrame:
    if after.height == 0 and before.height > 0:
        raise DataError(
            f"preprocessing step {step!r} removed every interaction ({setting}); relax it"
        )
    log_counts(step, after)
    return after


def implicit(df: pl.DataFrame, min_rating: float | None) -> pl.DataFrame:
    """Every interaction counts; with ``min_rating``, only ratings >= it. Drops the rating."""
    out = df
    if min_rating is not None:
        if RATING not in df.columns:
            raise DataError(
                f"data.min_rating={min_rating} is set but the data has no ratings; "
                "set data.rating_column or data.min_rating: null"
            )
        out = df.filter(pl.col(RATING) >= min_rating)
    out = out.drop(RATING, strict=False)
    return _checked("implicit", f"data.min_rating={min_rating}", df, out)


def sort_by_time(df: pl.DataFrame) -> pl.DataFrame:
    """Stable sort by (user, timestamp): ties and timestamp-free data keep the file order."""
    keys = [USER_ID, TIMESTAMP] if TIMESTAMP in df.columns else [USER_ID]
    out = df.sort(keys, maintain_order=True)
    log_counts("sort_by_time", out)
    if TIMESTAMP in df.columns:
        _warn_of_exact_repeats(out)
    return out


def _warn_of_exact_repeats(df: pl.DataFrame) -> None:
    """Rows with the user, item and second of another are most likely logged twice; kept
    (a repeat may be real), but a user whose test target repeats the validation item counts
    as a miss when seen items are filtered."""
    repeats = df.height - df.select(USER_ID, ITEM_ID, TIMESTAMP).n_unique()
    if repeats:
        logger.warning(
            "%d rows repeat another row's user, item and timestamp exactly (logged twice?); "
            "data.dedupe_consecutive: true drops an item that repeats the user's previous one",
            repeats,
        )


def k_core(df: pl.DataFrame, min_user: int, min_item: int) -> pl.DataFrame:
    """Drop users with < ``min_user`` and items with < ``min_item`` interactions, until stable.

    Interactions are counted with repeats (a user who rated an item twice counts 2).
    """
    out = df
    rounds = 0
    while True:
        rounds += 1
        filtered = out.filter(
            (pl.len().over(USER_ID) >= min_user) & (pl.len().over(ITEM_ID) >= min_item)
        )
        # The joint filter can leave a user or item under its threshold again: repeat.
        if filtered.height == out.height:
            break
        out = filtered
        if out.height == 0:
            break
    logger.debug("k_core converged after %d rounds", rounds)
    setting = f"data.min_user_interactions={min_user}, data.min_item_interactions={min_item}"
    return _checked("k_core", setting, df, out)


def dedupe_consecutive(df: pl.DataFrame) -> pl.DataFrame:
    """Drop an item that repeats the user's previous item (a-a-b-a -> a-b-a)."""
    previous = pl.col(ITEM_ID).shift(1).over(USER_ID)
    out = df.filter(previous.is_null() | (pl.col(ITEM_ID) != previous))
    return _checked("dedupe_consecutive", "data.dedupe_consecutive=true", df, out)


def keep_last(df: pl.DataFrame, n: int) -> pl.DataFrame:
    """Keep each user's last ``n`` interactions (the most recent ones)."""
    position = pl.int_range(pl.len(), dtype=pl.Int64).over(USER_ID)
    count = pl.len().over(USER_ID).cast(pl.Int64)  # pl.len() is unsigned: 1 - 3 would wrap
    out = df.filter(position >= count - n)
    return _checked("keep_last", f"data.max_history={n}", df, out)


def _ordered_ids(ids: pl.Series) -> list[str]:
    """Distinct ids in numeric order when all are integers, else in string order."""
    unique = ids.unique()
    numbers = unique.cast(pl.Int64, strict=False)
    frame = pl.DataFrame({"id": unique, "number": numbers})
    keys = ["number", "id"] if numbers.null_count() == 0 else ["id"]
    return frame.sort(keys)["id"].to_list()


def remap(df: pl.DataFrame) -> tuple[pl.DataFrame, IdMap]:
    """Original ids -> items 1..N (0 = padding) and users 0..U-1, both in original-id order.

    Numeric ids sort numerically, so an already-contiguous file (S3-Rec's) keeps its ids
    (minus one for users). The output is stably re-sorted by internal user, so each
    user's rows stay in time order. Columns become Int64.
    """
    if df.height == 0:
        raise DataError("remap: there are no interactions left to index")
    users = _ordered_ids(df[USER_ID])
    items = _ordered_ids(df[ITEM_ID])
    out = df.with_columns(
        pl.col(USER_ID).cast(pl.Enum(users)).to_physical().cast(pl.Int64),
        (pl.col(ITEM_ID).cast(pl.Enum(items)).to_physical().cast(pl.Int64) + 1),
    ).sort(USER_ID, maintain_order=True)
    log_counts("remap", out)
    return out, IdMap(users=users, items=items)
