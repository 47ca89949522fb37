"""Original <-> internal ids. Items are 1..N (0 = padding); users are 0-based row indices."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from seqrec.data.schema import DataError
from seqrec.io import atomic_write_text


@dataclass(frozen=True)
class IdMap:
    """``items[i - 1]`` is the original id of internal item i; ``users[u]`` of user row u.

    Original ids are kept as strings: files disagree on whether ids are numbers.
    """

    users: list[str]
    items: list[str]
    _item_index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_item_index", {item: i + 1 for i, item in enumerate(self.items)})
        if len(self._item_index) != len(self.items):
            raise DataError("IdMap: duplicate original item ids")

    @property
    def num_items(self) -> int:
        return len(self.items)

    def item_to_internal(self, original: Sequence[str]) -> tuple[npt.NDArray[np.int64], list[str]]:
        """Map original item ids; returns (internal ids of the known ones, in order, and the
        unknown ids, each once, in order of first appearance)."""
        known: list[int] = []
        unknown: dict[str, None] = {}  # a long history may repeat an id thousands of times
        for item in original:
            index = self._item_index.get(str(item))
            if index is None:
                unknown[str(item)] = None
            else:
                known.append(index)
        return np.asarray(known, dtype=np.int64), list(unknown)

    def item_to_original(self, internal: npt.ArrayLike) -> list[str]:
        return [self.items[int(i) - 1] for i in np.asarray(internal).ravel()]

    def save(self, path: str | Path) -> None:
        atomic_write_text(Path(path), json.dumps({"users": self.users, "items": self.items}))

    @classmethod
    def load(cls, path: str | Path) -> IdMap:
        """The id map ``save`` wrote; ``DataError`` naming the file when its content is not one
        (an ``OSError`` when it cannot be read at all)."""
        path = Path(path)
        data = path.read_bytes()
        try:
            raw = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError as err:
            raise DataError(
                f"{path} is corrupt (not UTF-8: {err.reason} at byte {err.start})"
            ) from None
        except ValueError as err:
            raise DataError(f"{path} is corrupt (invalid JSON: {err})") from None
        if not isinstance(raw, dict) or not {"users", "items"} <= raw.keys():
            raise DataError(f'{path} is corrupt (not an object with "users" and "items")')
        try:
            return cls(users=_ids(raw["users"], "users"), items=_ids(raw["items"], "items"))
        except DataError as err:
            raise DataError(f"{path} is corrupt ({err})") from None


def catalogue_difference(there: Sequence[str], here: Sequence[str], where: str) -> str:
    """How two item catalogues (an IdMap's ``items``) differ, for an error: their sizes, or
    the first internal id that names another item ``where`` than in the data."""
    if len(there) != len(here):
        return f"{len(there)} items {where}, {len(here)} in the data"
    i = next((i for i, (a, b) in enumerate(zip(there, here, strict=True)) if a != b), None)
    if i is None:
        return "the same items"
    return f"internal item {i + 1} is {there[i]!r} {where}, {here[i]!r} in the data"


def _ids(values: object, key: str) -> list[str]:
    """A list of original ids as ``save`` writes them. Whole numbers are taken as their text;
    anything else (a string iterated letter by letter, null, 1.0) would silently differ."""
    if not isinstance(values, list):
        raise DataError(f'"{key}" is a {type(values).__name__}, not a list')
    for value in values:
        if not isinstance(value, str | int) or isinstance(value, bool):
            raise DataError(f'"{key}" holds {json.dumps(value)[:40]}, not an id')
    return [str(value) for value in values]
