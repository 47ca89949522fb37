"""Canonical column names of an interaction table and the error type of the data layer."""

from __future__ import annotations

USER_ID = "user_id"
ITEM_ID = "item_id"
TIMESTAMP = "timestamp"
RATING = "rating"


class DataError(ValueError):
    """Bad input data: a malformed file, a missing dataset, a filter that empties the data."""
