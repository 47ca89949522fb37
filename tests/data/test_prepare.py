from __future__ import annotations

import json
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from seqrec.config import DataConfig, warn_once
from seqrec.data import digests as digests_module
from seqrec.data import prepare as prepare_module
from seqrec.data.info import describe, format_info
from seqrec.data.prepare import prepare
from seqrec.data.schema import DataError
from seqrec.data.sequences import PreparedData

# u1 has a timestamp tie (t=3) that must keep file order; u3 is too short for 2-core users.
CSV = """user,item,ts,stars
u2,b,5,4
u1,a,3,5
u1,c,1,3
u1,b,3,4
u2,a,2,5
u2,c,9,2
u3,a,4,5
u1,a,7,1
"""


def write_csv(tmp_path: Path) -> Path:
    path = tmp_path / "log.csv"
    path.write_text(CSV)
    return path


def csv_config(path: Path, **overrides: object) -> DataConfig:
    fields: dict[str, object] = {
        "dataset": "file",
        "path": str(path),
        "user_column": "user",
        "item_column": "item",
        "timestamp_column": "ts",
        "rating_column": "stars",
        "min_user_interactions": 2,
        "min_item_interactions": 1,
        **overrides,
    }
    return DataConfig(**fields)  # type: ignore[arg-type]


def rows(prepared: PreparedData) -> list[list[str]]:
    seqs, id_map = prepared.sequences, prepared.id_map
    return [id_map.item_to_original(seqs[u]) for u in range(len(seqs))]


def assert_same(a: PreparedData, b: PreparedData) -> None:
    assert a.id_map == b.id_map
    assert (a.name, a.source) == (b.name, b.source)
    np.testing.assert_array_equal(a.sequences.offsets, b.sequences.offsets)
    np.testing.assert_array_equal(a.sequences.items, b.sequences.items)
    if a.timestamps is None:
        assert b.timestamps is None
    else:
        np.testing.assert_array_equal(a.timestamps, b.timestamps)
    for part in ("valid", "test"):
        x, y = getattr(a.split, part), getattr(b.split, part)
        np.testing.assert_array_equal(x.users, y.users)
        np.testing.assert_array_equal(x.targets, y.targets)
        np.testing.assert_array_equal(x.histories.items, y.histories.items)
    np.testing.assert_array_equal(a.split.train.items, b.split.train.items)
    np.testing.assert_array_equal(a.split.train_users, b.split.train_users)


def test_csv_pipeline_end_to_end(tmp_path: Path) -> None:
    prepared = prepare(csv_config(write_csv(tmp_path)), use_cache=False)
    assert prepared.name == "log.csv"
    assert prepared.id_map.users == ["u1", "u2"]  # u3 dropped by the 2-core on users
    assert prepared.id_map.items == ["a", "b", "c"]
    assert rows(prepared) == [["c", "a", "b", "a"], ["a", "b", "c"]]
    assert prepared.timestamps is not None
    assert prepared.timestamps.tolist() == [1, 3, 3, 7, 2, 5, 9]
    assert prepared.split.test.targets.tolist() == [1, 3]  # "a" for u1, "c" for u2


def test_min_rating_and_dedupe_and_keep_last(tmp_path: Path) -> None:
    config = csv_config(write_csv(tmp_path), min_rating=3.0, dedupe_consecutive=True)
    assert rows(prepare(config, use_cache=False)) == [["c", "a", "b"], ["a", "b"]]
    # (3 leaves leave-one-out nothing to train on, so another split)
    config = csv_config(write_csv(tmp_path), max_history=3, split="global_temporal")
    assert rows(prepare(config, use_cache=False)) == [["a", "b", "a"], ["a", "b", "c"]]


def test_a_warning_of_preparing_is_repeated_by_every_cache_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An unread time column was warned of once; later commands loaded the cache and trained
    on the file order without a word."""
    warn_once.cache_clear()
    config = csv_config(write_csv(tmp_path), timestamp_column=None)
    warning = "the table has a column 'ts' but data.timestamp_column is not set"
    for _ in range(2):  # built, then loaded
        caplog.clear()
        with caplog.at_level(logging.INFO):
            prepare(config, cache_dir=tmp_path / "cache")
        assert [r.getMessage() for r in caplog.records if warning in r.getMessage()], caplog.text
    assert "loaded prepared log.csv" in caplog.text  # the second time, from the cache


def test_filter_that_empties_the_data_names_the_step(tmp_path: Path) -> None:
    config = csv_config(write_csv(tmp_path), min_rating=6.0)
    with pytest.raises(DataError, match=r"'implicit' removed every interaction.*min_rating=6"):
        prepare(config, use_cache=False)


def test_global_temporal_on_a_file(tmp_path: Path) -> None:
    config = csv_config(write_csv(tmp_path), split="global_temporal", temporal_quantile=0.5)
    split = prepare(config, use_cache=False).split
    assert split.protocol == "global_temporal"
    assert len(split.test) >= 1


def test_global_temporal_needs_timestamps(tmp_path: Path) -> None:
    path = tmp_path / "seq.txt"
    path.write_text("1 1 2 3\n2 2 3 1\n")
    config = DataConfig(
        dataset="file",
        path=str(path),
        split="global_temporal",
        min_user_interactions=1,
        min_item_interactions=1,
    )
    with pytest.raises(DataError, match=r"global_temporal needs timestamps"):
        prepare(config, use_cache=False)


def test_missing_file_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"data.path .*nope.csv does not exist"):
        prepare(DataConfig(dataset="file", path=str(tmp_path / "nope.csv")))


def cache_entries(cache: Path) -> list[Path]:
    root = cache / "prepared"
    return sorted(root.iterdir()) if root.exists() else []


def test_cache_round_trip_loads_without_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = csv_config(write_csv(tmp_path))
    built = prepare(config, cache_dir=tmp_path / "cache")
    (entry,) = cache_entries(tmp_path / "cache")
    assert sorted(p.name for p in entry.iterdir()) == ["data.npz", "idmap.json", "meta.json"]

    def no_reading(*args: object) -> None:
        raise AssertionError("the cache should have been used")

    monkeypatch.setattr(prepare_module, "read_source", no_reading)
    assert_same(built, prepare(config, cache_dir=tmp_path / "cache"))


def test_cache_defaults_to_the_user_cache(tmp_path: Path) -> None:
    prepare(csv_config(write_csv(tmp_path)))
    assert len(cache_entries(Path(os.environ["SEQREC_CACHE_DIR"]))) == 1


def test_cache_key_follows_config_and_file(tmp_path: Path) -> None:
    path = write_csv(tmp_path)
    cache = tmp_path / "cache"
    prepare(csv_config(path), cache_dir=cache)
    prepare(csv_config(path, dedupe_consecutive=True), cache_dir=cache)
    assert len(cache_entries(cache)) == 2
    path.write_text(CSV + "u3,b,8,5\n")
    changed = prepare(csv_config(path), cache_dir=cache)
    assert len(cache_entries(cache)) == 3
    assert changed.id_map.users == ["u1", "u2", "u3"]
    # the same file named another way (train stores it absolute, a user may not)
    relative = os.path.relpath(path)
    for written in (relative, f"./{relative}", str(path.resolve())):
        prepare(csv_config(Path(written)), cache_dir=cache)
    assert len(cache_entries(cache)) == 3


def test_a_rewrite_keeping_size_and_mtime_is_prepared_anew(tmp_path: Path) -> None:
    # As `cp -p` or `rsync -t` leave it: other bytes, the same size and modification time.
    path = write_csv(tmp_path)
    cache = tmp_path / "cache"
    before = path.stat()
    assert prepare(csv_config(path), cache_dir=cache).id_map.users == ["u1", "u2"]
    path.write_text(CSV.replace("u1", "u9"))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size
    assert prepare(csv_config(path), cache_dir=cache).id_map.users == ["u2", "u9"]
    assert len(cache_entries(cache)) == 2


def test_an_unchanged_file_is_hashed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_csv(tmp_path)
    cache = tmp_path / "cache"
    hashed: list[Path] = []
    real = digests_module.sha256_file
    monkeypatch.setattr(digests_module, "sha256_file", lambda p: hashed.append(p) or real(p))
    for _ in range(3):
        prepare(csv_config(path), cache_dir=cache)
    assert hashed == [path]
    os.chmod(path, 0o600)  # the status changed (ctime): hashed again, the same entry
    prepare(csv_config(path), cache_dir=cache)
    assert hashed == [path, path]
    assert len(cache_entries(cache)) == 1


def test_use_cache_false_writes_nothing(tmp_path: Path) -> None:
    prepare(csv_config(write_csv(tmp_path)), cache_dir=tmp_path / "cache", use_cache=False)
    assert not (tmp_path / "cache").exists()  # no entry, no remembered digest


@pytest.mark.parametrize(
    "damage",
    ["truncate_npz", "garbage_npz", "garbage_meta", "drop_idmap", "tampered_items"],
)
def test_corrupt_cache_is_rebuilt(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = csv_config(write_csv(tmp_path))
    built = prepare(config, cache_dir=tmp_path / "cache")
    (entry,) = cache_entries(tmp_path / "cache")
    npz = entry / "data.npz"
    if damage == "truncate_npz":
        npz.write_bytes(npz.read_bytes()[:100])
    elif damage == "garbage_npz":
        npz.write_bytes(b"\x00" * 64)
    elif damage == "garbage_meta":
        (entry / "meta.json").write_text("{not json")
    elif damage == "drop_idmap":
        (entry / "idmap.json").unlink()
    else:  # a well-formed archive with wrong content and a meta that matches it
        with np.load(npz) as data:
            arrays = {key: data[key] for key in data.files}
        arrays["items"] = arrays["items"] + 100
        with open(npz, "wb") as handle:
            np.savez(handle, **arrays)
        meta = json.loads((entry / "meta.json").read_text())
        meta["data_sha256"] = prepare_module.sha256_file(npz)
        (entry / "meta.json").write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING, logger="seqrec.data.prepare"):
        rebuilt = prepare(config, cache_dir=tmp_path / "cache")
    assert "damaged" in caplog.text
    assert_same(built, rebuilt)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="seqrec.data.prepare"):
        assert_same(built, prepare(config, cache_dir=tmp_path / "cache"))
    assert "damaged" not in caplog.text  # the entry was repaired, not rebuilt every time
    assert [p.name for p in (tmp_path / "cache" / "prepared").iterdir()] == [entry.name]


def test_preparers_racing_for_one_entry_leave_one_sound_entry(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As when two trainings start together, or every node of a torchrun job prepares into a
    shared cache: each builds the entry, one publishes it whole, nothing is left half-written."""
    config = csv_config(write_csv(tmp_path))
    cache = tmp_path / "cache"
    start = threading.Barrier(6)

    def build(_: int) -> PreparedData:
        start.wait()
        return prepare(config, cache_dir=cache)

    with ThreadPoolExecutor(6) as pool:
        built = list(pool.map(build, range(6)))
    for other in built[1:]:
        assert_same(built[0], other)
    (entry,) = cache_entries(cache)
    assert sorted(p.name for p in entry.iterdir()) == ["data.npz", "idmap.json", "meta.json"]
    with caplog.at_level(logging.WARNING, logger="seqrec.data.prepare"):
        assert_same(built[0], prepare(config, cache_dir=cache))
    assert "damaged" not in caplog.text


def test_synthetic_prepares_and_caches(tmp_path: Path) -> None:
    config = DataConfig(
        dataset="synthetic", synthetic_users=150, synthetic_items=120, split="global_temporal"
    )
    first = prepare(config, cache_dir=tmp_path)
    assert first.name == "synthetic"
    assert first.timestamps is not None
    assert len(first.split.test) > 0
    assert_same(first, prepare(config, cache_dir=tmp_path))
    other = prepare(
        DataConfig(dataset="synthetic", synthetic_users=150, synthetic_items=120, synthetic_seed=1),
        cache_dir=tmp_path,
    )
    assert not np.array_equal(other.sequences.items, first.sequences.items)


def test_describe_hand_computed(tmp_path: Path) -> None:
    info = describe(prepare(csv_config(write_csv(tmp_path)), use_cache=False))
    assert info == {
        "dataset": "log.csv",
        "source": str(tmp_path / "log.csv"),
        "users": 2,
        "items": 3,
        "interactions": 7,
        "mean_length": 3.5,
        "median_length": 3.5,
        "density": 6 / 6,  # 6 distinct (user, item) pairs: u1 rated a twice (7 / 6 once)
        "timestamps": True,
        "split": "leave_one_out",
        "train_users": 2,
        "train_interactions": 3,
        "valid_users": 2,
        "test_users": 2,
    }
    text = format_info(info)
    assert "interactions        7" in text
    assert "timestamps          yes" in text


def test_a_directory_of_shards_prepares_as_one_file_and_a_new_shard_prepares_anew(
    tmp_path: Path,
) -> None:
    whole = pl.read_csv(write_csv(tmp_path))
    folder = tmp_path / "log"
    folder.mkdir()
    whole[:6].write_parquet(folder / "part-0.parquet")
    whole[6:].write_parquet(folder / "part-1.parquet")
    cache = tmp_path / "cache"
    from_shards = prepare(csv_config(folder), cache_dir=cache)
    from_file = prepare(csv_config(tmp_path / "log.csv"), cache_dir=cache)
    assert rows(from_shards) == rows(from_file)
    assert from_shards.id_map == from_file.id_map
    assert len(cache_entries(cache)) == 2
    pl.DataFrame({"user": ["u3"], "item": ["b"], "ts": [8], "stars": [5]}).write_parquet(
        folder / "part-2.parquet"
    )
    grown = prepare(csv_config(folder), cache_dir=cache)
    assert len(cache_entries(cache)) == 3
    assert grown.id_map.users == ["u1", "u2", "u3"]
