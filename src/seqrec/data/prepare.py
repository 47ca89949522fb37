"""``prepare``: read -> preprocess -> remap -> CSR arrays -> split, cached on disk.

The whole pipeline is visible in ``prepare``; every stage is a pure function from
``readers``, ``preprocess`` and ``split``. The result is cached under
``<cache>/prepared/<key>/`` as ``data.npz`` (all arrays), ``idmap.json`` and
``meta.json`` (written last, with the sha256 of the other two, so an entry is complete
and intact or it is rebuilt). The key hashes the source identity (resolved path and the
sha256 of the file's bytes, ``seqrec.data.digests``; or the synthetic generator's settings)
and every DataConfig field that can change the result.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from seqrec.config import SYNTHETIC_FIELDS, DataConfig, FileFormat
from seqrec.data import preprocess
from seqrec.data.datasets import DATASETS, locate_dataset, user_cache_dir
from seqrec.data.digests import content_sha256
from seqrec.data.download import sha256_file
from seqrec.data.idmap import IdMap
from seqrec.data.readers import ColumnMap, read_interactions, shard_files
from seqrec.data.schema import ITEM_ID, TIMESTAMP, USER_ID, DataError
from seqrec.data.sequences import EvalSet, IntArray, PreparedData, Sequences, Split
from seqrec.data.split import make_split
from seqrec.data.synthetic import GENERATOR_VERSION, synthetic_interactions
from seqrec.io import atomic_folder

logger = logging.getLogger(__name__)

CACHE_VERSION = 2  # bump when the pipeline's output changes for the same inputs


@dataclass(frozen=True)
class Source:
    """Where the interactions come from, and what identifies that input for the cache."""

    name: str  # dataset name, or the file name for dataset: file
    location: str  # a path, or "generated"
    path: Path | None  # None for generated data
    format: FileFormat
    identity: dict[str, Any]


def prepare(
    config: DataConfig,
    data_dir: str | Path | None = None,
    *,
    cache_dir: str | Path | None = None,
    download: bool = True,
    use_cache: bool = True,
) -> PreparedData:
    """Build (or load from the cache) the prepared arrays and split for ``config``.

    Args:
        data_dir: where ``<name>/<file>`` of a registry dataset is looked for first.
        cache_dir: the cache root (downloads and prepared data); default: the user cache.
        download: allow downloading a registry dataset that is not found locally.
        use_cache: read and write ``<cache>/prepared/``; False rebuilds and writes nothing.
    """
    cache_root = Path(cache_dir) if cache_dir is not None else user_cache_dir()
    source = resolve_source(
        config, data_dir, cache_dir=cache_root, download=download, remember_digests=use_cache
    )
    entry = cache_root / "prepared" / cache_key(config, source)
    if use_cache:
        cached = load_prepared(entry)
        if cached is not None:
            logger.info("loaded prepared %s from %s", source.name, entry)
            return cached

    with _warnings_logged() as warnings:
        df = read_source(source, config)
        preprocess.log_counts("read", df)
        _check_published_counts(config.dataset, source, df)
        df = preprocess.implicit(df, config.min_rating)
        df = preprocess.sort_by_time(df)
        df = preprocess.k_core(df, config.min_user_interactions, config.min_item_interactions)
        if config.dedupe_consecutive:
            df = preprocess.dedupe_consecutive(df)
        if config.max_history is not None:
            df = preprocess.keep_last(df, config.max_history)
        df, id_map = preprocess.remap(df)
        sequences, timestamps = to_sequences(df, len(id_map.users))
        split = make_split(config.split, sequences, timestamps, config.temporal_quantile)
    prepared = PreparedData(source.name, source.location, sequences, timestamps, id_map, split)

    if use_cache:
        save_prepared(prepared, entry, warnings)
        logger.info("cached prepared %s in %s", source.name, entry)
    return prepared


def _check_published_counts(dataset: str, source: Source, df: pl.DataFrame) -> None:
    """Warn when a registry dataset's file does not hold the published counts: a copy cut
    short, or another version, would otherwise give numbers under the dataset's name that
    do not compare with anyone's."""
    spec = DATASETS.get(dataset)
    if spec is None or spec.stats is None or source.path is None:
        return
    found = (df[USER_ID].n_unique(), df[ITEM_ID].n_unique(), df.height)
    if found != spec.stats:
        users, items, interactions = spec.stats
        logger.warning(
            "%s in %s holds %s users / %s items / %s interactions, not the published %s / %s / "
            "%s: it is cut short or another version, and results on it do not compare with "
            "published ones (read it with data.dataset: file to name it yours)",
            dataset,
            source.location,
            *(f"{count:,}" for count in found),
            f"{users:,}",
            f"{items:,}",
            f"{interactions:,}",
        )


def resolve_source(
    config: DataConfig,
    data_dir: str | Path | None = None,
    *,
    cache_dir: str | Path | None = None,
    download: bool = True,
    remember_digests: bool = True,
) -> Source:
    """Which input ``config`` names: generated data, ``data.path``, or a located dataset file.
    ``remember_digests``: keep the files' sha256 in the cache (``seqrec.data.digests``)."""
    if config.dataset == "synthetic":
        settings = {name: getattr(config, name) for name in SYNTHETIC_FIELDS}
        settings["generator_version"] = GENERATOR_VERSION
        return Source("synthetic", "generated", None, "auto", {"synthetic": settings})
    cache_root = Path(cache_dir) if cache_dir is not None else user_cache_dir()
    digests = cache_root / "digests" if remember_digests else None
    if config.dataset == "file":
        assert config.path is not None  # DataConfig checks this
        path = Path(config.path).expanduser()
        if path.is_dir():
            identity = _shards_identity(path, digests)
            return Source(path.name, str(path), path, config.format, identity)
        if not path.is_file():
            raise DataError(f"data.path {path} does not exist")
        return Source(path.name, str(path), path, config.format, _file_identity(path, digests))
    located = locate_dataset(config.dataset, data_dir, cache_dir=cache_dir, download=download)
    fmt = located.file.format if config.format == "auto" else config.format
    identity = _file_identity(located.path, digests)
    return Source(config.dataset, str(located.path), located.path, fmt, identity)


def _file_identity(path: Path, digests: Path | None) -> dict[str, Any]:
    """What the file holds (its sha256), not its size and mtime: see ``seqrec.data.digests``."""
    sha256 = content_sha256(path, digests)
    return {"path": str(path.resolve()), "size": path.stat().st_size, "sha256": sha256}


def _shards_identity(folder: Path, digests: Path | None) -> dict[str, Any]:
    """A directory log's identity: every shard's, so that an added, removed or rewritten shard
    prepares the data anew."""
    shards = [
        {**_file_identity(shard, digests), "path": str(shard.relative_to(folder))}
        for shard in shard_files(folder)
    ]
    return {"path": str(folder.resolve()), "shards": shards}


def cache_key(config: DataConfig, source: Source) -> str:
    """A hash of the source identity and every config field that can change the result."""
    fields = dataclasses.asdict(config)
    # The file is the source's identity (its resolved path and bytes), not the path as
    # written: log.csv, ./log.csv and its absolute path share an entry.
    fields.pop("path")
    if source.path is not None:  # the generator's settings only matter to generated data
        for name in SYNTHETIC_FIELDS:
            fields.pop(name)
    blob = json.dumps(
        {"version": CACHE_VERSION, "source": source.identity, "config": fields},
        sort_keys=True,
        default=str,
    )
    return f"{source.name}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def read_source(source: Source, config: DataConfig) -> pl.DataFrame:
    """The raw interaction frame of ``source`` (generated or read)."""
    if source.path is None:
        return synthetic_interactions(config)
    return read_interactions(source.path, source.format, ColumnMap.from_config(config))


def to_sequences(df: pl.DataFrame, num_users: int) -> tuple[Sequences, IntArray | None]:
    """A remapped frame (rows grouped by user, in time order) -> CSR sequences (+ timestamps)."""
    users = df[USER_ID].to_numpy()
    assert (np.diff(users) >= 0).all(), "rows must be grouped by internal user id"
    offsets = np.zeros(num_users + 1, dtype=np.int64)
    np.cumsum(np.bincount(users, minlength=num_users), out=offsets[1:])
    items = df[ITEM_ID].to_numpy().astype(np.int32)
    timestamps = df[TIMESTAMP].to_numpy().astype(np.int64) if TIMESTAMP in df.columns else None
    return Sequences(offsets, items), timestamps


# ---- the on-disk cache --------------------------------------------------------------------


def _arrays(prepared: PreparedData) -> dict[str, np.ndarray[Any, Any]]:
    split = prepared.split
    arrays: dict[str, np.ndarray[Any, Any]] = {
        "offsets": prepared.sequences.offsets,
        "items": prepared.sequences.items,
        "train_offsets": split.train.offsets,
        "train_items": split.train.items,
        "train_users": split.train_users,
    }
    for part, evalset in (("valid", split.valid), ("test", split.test)):
        arrays[f"{part}_users"] = evalset.users
        arrays[f"{part}_offsets"] = evalset.histories.offsets
        arrays[f"{part}_items"] = evalset.histories.items
        arrays[f"{part}_targets"] = evalset.targets
    if prepared.timestamps is not None:
        arrays["timestamps"] = prepared.timestamps
    return arrays


@contextmanager
def _warnings_logged() -> Iterator[list[str]]:
    """The warnings seqrec's loggers give meanwhile (an unread time column, counts that are not
    the published ones), kept with the cache entry: every later load repeats them."""
    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler = Keep(logging.WARNING)
    package = logging.getLogger("seqrec")
    package.addHandler(handler)
    try:
        yield messages
    finally:
        package.removeHandler(handler)


def save_prepared(prepared: PreparedData, folder: Path, warnings: Sequence[str] = ()) -> None:
    """Write the cache entry, published whole (``atomic_folder``): processes that prepare the
    same entry at once each build it and the first to finish wins; a damaged entry is replaced.
    ``warnings``: what preparing it warned of, said again by every load.
    """
    arrays = _arrays(prepared)
    with atomic_folder(folder, keep_existing=_is_sound) as staging:
        with open(staging / "data.npz", "wb") as handle:  # np.savez would append ".npz" to a name
            np.savez(handle, allow_pickle=False, **arrays)
        prepared.id_map.save(staging / "idmap.json")
        meta = {
            "version": CACHE_VERSION,
            "name": prepared.name,
            "source": prepared.source,
            "protocol": prepared.split.protocol,
            "data_sha256": sha256_file(staging / "data.npz"),
            "idmap_sha256": sha256_file(staging / "idmap.json"),
            "warnings": list(warnings),
        }
        (staging / "meta.json").write_text(json.dumps(meta, indent=1))


def load_prepared(folder: Path) -> PreparedData | None:
    """The cached entry, or None when there is none or it is damaged (then it is rebuilt)."""
    if not (folder / "meta.json").is_file():
        return None
    try:
        prepared = _load_entry(folder)
        warnings = json.loads((folder / "meta.json").read_text()).get("warnings", [])
    except _DAMAGE as err:
        logger.warning("prepared-data cache %s is damaged (%s); rebuilding it", folder, err)
        return None
    for message in warnings:
        logger.warning("%s", message)
    return prepared


# What reading a damaged or half-replaced entry raises.
_DAMAGE = (OSError, ValueError, KeyError, TypeError, DataError, zipfile.BadZipFile)


def _is_sound(folder: Path) -> bool:
    """Whether an existing entry loads; a new entry replaces it otherwise."""
    try:
        _load_entry(folder)
    except _DAMAGE:
        return False
    return True


def _load_entry(folder: Path) -> PreparedData:
    return _load_checked(folder, json.loads((folder / "meta.json").read_text()))


def _load_checked(folder: Path, meta: dict[str, Any]) -> PreparedData:
    _check_files(folder, meta)
    id_map = IdMap.load(folder / "idmap.json")
    with np.load(folder / "data.npz", allow_pickle=False) as npz:
        a = {key: npz[key] for key in npz.files}
    num_items = id_map.num_items
    sequences = _sequences(a["offsets"], a["items"], num_items)
    if len(sequences) != len(id_map.users):
        raise ValueError("user count differs from the id map")
    timestamps = a["timestamps"].astype(np.int64) if "timestamps" in a else None
    if timestamps is not None and len(timestamps) != len(sequences.items):
        raise ValueError("timestamps do not line up with items")
    split = Split(
        protocol=str(meta["protocol"]),
        train=_sequences(a["train_offsets"], a["train_items"], num_items),
        train_users=_users(a["train_users"], len(sequences)),
        valid=_evalset(a, "valid", num_items, len(sequences)),
        test=_evalset(a, "test", num_items, len(sequences)),
    )
    return PreparedData(
        str(meta["name"]), str(meta["source"]), sequences, timestamps, id_map, split
    )


def _check_files(folder: Path, meta: dict[str, Any]) -> None:
    if meta["version"] != CACHE_VERSION:
        raise ValueError(f"cache version {meta['version']} != {CACHE_VERSION}")
    for name, key in (("data.npz", "data_sha256"), ("idmap.json", "idmap_sha256")):
        if sha256_file(folder / name) != meta[key]:
            raise ValueError(f"{name} does not match its recorded sha256")


def _sequences(offsets: np.ndarray[Any, Any], items: np.ndarray[Any, Any], n: int) -> Sequences:
    """Validate explicitly (Sequences only asserts, and asserts vanish under -O)."""
    if offsets.ndim != 1 or len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(items):
        raise ValueError("bad offsets")
    if (np.diff(offsets) < 0).any() or (len(items) and (items.min() < 1 or items.max() > n)):
        raise ValueError("bad item ids")
    return Sequences(offsets.astype(np.int64), items.astype(np.int32))


def _users(users: np.ndarray[Any, Any], num_users: int) -> IntArray:
    if len(users) and (users.min() < 0 or users.max() >= num_users):
        raise ValueError("bad user rows")
    return users.astype(np.int64)


def _evalset(a: dict[str, np.ndarray[Any, Any]], part: str, n: int, num_users: int) -> EvalSet:
    users = _users(a[f"{part}_users"], num_users)
    histories = _sequences(a[f"{part}_offsets"], a[f"{part}_items"], n)
    targets = a[f"{part}_targets"].astype(np.int32)
    if not len(users) == len(histories) == len(targets):
        raise ValueError(f"{part} arrays differ in length")
    return EvalSet(users, histories, targets)
