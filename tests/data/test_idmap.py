"""The id map file: a round trip, and one ``DataError`` naming the file for every bad content."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqrec.data.idmap import IdMap
from seqrec.data.schema import DataError


def test_id_map_round_trip(tmp_path: Path) -> None:
    id_map = IdMap(users=["u1", "7"], items=["a", "b", "12"])
    id_map.save(tmp_path / "id_map.json")
    assert IdMap.load(tmp_path / "id_map.json") == id_map


def test_whole_number_ids_read_as_their_text(tmp_path: Path) -> None:
    path = tmp_path / "id_map.json"
    path.write_text(json.dumps({"users": [1, 2], "items": [10, "x"]}))
    assert IdMap.load(path) == IdMap(users=["1", "2"], items=["10", "x"])


@pytest.mark.parametrize(
    ("content", "detail"),
    [
        (b'{"users": ["u1"], "items": ["a"', "invalid JSON: "),
        (b'{"users": ["\xe9"], "items": []}', "not UTF-8: invalid continuation byte at byte 12"),
        (b"[]", 'not an object with "users" and "items"'),
        (b'{"users": ["u1"]}', 'not an object with "users" and "items"'),
        (b'{"users": "u1u2", "items": ["a"]}', '"users" is a str, not a list'),
        (b'{"users": ["u1"], "items": {"a": 1}}', '"items" is a dict, not a list'),
        (b'{"users": ["u1"], "items": ["a", null]}', '"items" holds null, not an id'),
        (b'{"users": ["u1"], "items": [1.5]}', '"items" holds 1.5, not an id'),
        (b'{"users": [true], "items": ["a"]}', '"users" holds true, not an id'),
        (b'{"users": ["u1"], "items": [["a"]]}', '"items" holds ["a"], not an id'),
        (b'{"users": ["u1"], "items": ["a", "a"]}', "duplicate original item ids"),
    ],
    ids=[
        "truncated",
        "not-utf8",
        "a-list",
        "no-items",
        "users-a-string",
        "items-a-dict",
        "null",
        "float",
        "bool",
        "nested",
        "duplicate",
    ],
)
def test_a_corrupt_id_map_names_the_file_and_the_damage(
    tmp_path: Path, content: bytes, detail: str
) -> None:
    path = tmp_path / "id_map.json"
    path.write_bytes(content)
    with pytest.raises(DataError) as caught:
        IdMap.load(path)
    message = str(caught.value)
    assert message.startswith(f"{path} is corrupt ("), message
    assert detail in message


def test_a_missing_id_map_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        IdMap.load(tmp_path / "id_map.json")
