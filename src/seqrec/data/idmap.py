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
        """Map original item ids; returns (internal ids of the known ones, unknown ids)."""
        known: list[int] = []
        unknown: list[str] = []
        for item in original:
            index = self._item_index.get(str(item))
            if index is None:
                unknown.append(str(item))
            else:
                known.append(index)
        return np.asarray(known, dtype=np.int64), unknown

    def item_to_original(self, internal: npt.ArrayLike) -> list[str]:
        return [self.items[int(i) - 1] for i in np.asarray(internal).ravel()]

    def save(self, path: str | Path) -> None:
        atomic_write_text(Path(path), json.dumps({"users": self.users, "items": self.items}))

    @classmethod
    def load(cls, path: str | Path) -> IdMap:
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
            return cls(users=[str(u) for u in raw["users"]], items=[str(i) for i in raw["items"]])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise DataError(f"cannot read id map {path}: {err}") from None
