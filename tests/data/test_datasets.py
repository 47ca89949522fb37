from __future__ import annotations

import gzip
import hashlib
import re
from pathlib import Path

import pytest

from seqrec.data.datasets import (
    DATASETS,
    datasets_with_timestamps,
    get_dataset,
    locate_dataset,
    resolve_default_dataset,
    user_cache_dir,
)
from seqrec.data.info import dataset_table
from seqrec.data.schema import DataError
from tests.tiny import REQUIRED_DATASETS

REQUIRED = REQUIRED_DATASETS


def put(root: Path, dataset: str, name: str, text: str = "1 2 3\n") -> Path:
    path = root / dataset / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def test_registry_lists_the_required_datasets() -> None:
    assert list(DATASETS) == REQUIRED
    assert [row["name"] for row in dataset_table()] == REQUIRED


@pytest.mark.parametrize("name", [n for n in REQUIRED if n != "synthetic"])
def test_real_datasets_have_a_pinned_public_download(name: str) -> None:
    spec = DATASETS[name]
    assert spec.files
    assert spec.citation
    assert spec.download is not None
    assert spec.download.url.startswith("https://")
    assert spec.download.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", spec.download.sha256)
    if "githubusercontent" in spec.download.url:  # a commit, never a moving branch
        assert re.search(r"/[0-9a-f]{40}/", spec.download.url)
    # The downloaded file must be one the local lookup accepts.
    assert any(spec.download.filename in f.candidates() for f in spec.files)


def test_timestamped_datasets() -> None:
    assert datasets_with_timestamps() == ["ml-1m", "ml-100k", "synthetic"]


def test_unknown_dataset_lists_the_known_ones() -> None:
    with pytest.raises(DataError, match=r"unknown dataset 'ml-2m'; known: ml-1m, ml-100k"):
        get_dataset("ml-2m")


def test_resolution_order_explicit_then_env_then_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    explicit, env, cache = tmp_path / "explicit", tmp_path / "env", tmp_path / "cache"
    in_cache = put(cache / "downloads", "lastfm", "LastFM.txt")
    assert locate_dataset("lastfm", cache_dir=cache).path == in_cache
    in_env = put(env, "lastfm", "LastFM.txt.gz")
    monkeypatch.setenv("SEQREC_DATA_DIR", str(env))
    assert locate_dataset("lastfm", cache_dir=cache).path == in_env
    in_explicit = put(explicit, "lastfm", "LastFM.txt")  # the uncompressed name works too
    found = locate_dataset("lastfm", explicit, cache_dir=cache)
    assert (found.path, found.origin) == (in_explicit, "data dir")


def test_ml_1m_prefers_ratings_dat(tmp_path: Path) -> None:
    put(tmp_path, "ml-1m", "ml-1m.sequences.txt.gz")
    assert locate_dataset("ml-1m", tmp_path).file.format == "sequences"
    put(tmp_path, "ml-1m", "ratings.dat", "1::2::5::978300760\n")
    located = locate_dataset("ml-1m", tmp_path)
    assert located.path.name == "ratings.dat"
    assert located.file.timestamps


def test_missing_dataset_says_which_file_goes_where(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        locate_dataset("amazon-beauty", tmp_path / "data", cache_dir=tmp_path / "cache")
    message = str(info.value)
    for expected in (
        "Beauty.txt.gz or Beauty.txt",
        "<DIR>/amazon-beauty/",
        "--data-dir",
        "SEQREC_DATA_DIR",
        str(tmp_path / "cache" / "downloads" / "amazon-beauty"),
        "SEQREC_OFFLINE=1",
    ):
        assert expected in message


def test_a_data_dir_that_is_missing_or_the_dataset_folder_itself_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=rf"searched {tmp_path / 'nope' / 'lastfm'} \(.* does not "):
        locate_dataset("lastfm", tmp_path / "nope", cache_dir=tmp_path / "cache")
    put(tmp_path / "data", "lastfm", "LastFM.txt")
    folder = tmp_path / "data" / "lastfm"
    with pytest.raises(DataError, match=rf"pass its parent, --data-dir {tmp_path / 'data'};"):
        locate_dataset("lastfm", folder, cache_dir=tmp_path / "cache")


def test_download_false_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEQREC_OFFLINE")
    with pytest.raises(DataError, match=r"downloading was turned off \(download=False\)"):
        locate_dataset("yelp", tmp_path, cache_dir=tmp_path, download=False)


def test_user_cache_dir_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQREC_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "b"))
    assert user_cache_dir() == tmp_path / "a"
    monkeypatch.delenv("SEQREC_CACHE_DIR")
    assert user_cache_dir() == tmp_path / "b" / "seqrec"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_cache_dir() == tmp_path / "home" / ".cache" / "seqrec"


def test_default_dataset_falls_back_to_synthetic_offline(tmp_path: Path) -> None:
    name, why = resolve_default_dataset(tmp_path)
    assert name == "synthetic"
    assert "ML-1M is not available" in why


def test_default_dataset_is_ml_1m_when_present(tmp_path: Path) -> None:
    path = put(tmp_path, "ml-1m", "ml-1m.sequences.txt.gz")
    name, where = resolve_default_dataset(tmp_path)
    assert name == "ml-1m"
    assert str(path) in where


def test_registry_checksums_match_the_shared_files(shared_data: Path) -> None:
    """The registry's sha256 (of the published file) equals the shared copy's content."""
    checked = 0
    for spec in DATASETS.values():
        if spec.download is None or spec.download.sha256 is None:
            continue
        for name in (spec.download.filename, spec.download.filename + ".gz"):
            path = shared_data / spec.name / name
            if path.is_file():
                data = path.read_bytes()
                data = gzip.decompress(data) if name.endswith(".gz") else data
                assert hashlib.sha256(data).hexdigest() == spec.download.sha256, spec.name
                checked += 1
    assert checked == 7  # all but ml-1m (zip not shared) and steam (no checksum)


def test_a_registry_file_without_the_published_counts_is_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A copy cut short was prepared and reported under the dataset's name without a word."""
    from seqrec.config import DataConfig
    from seqrec.data.prepare import prepare

    put(tmp_path, "lastfm", "LastFM.txt", "1 2 3 4\n2 3 4 5\n")
    config = DataConfig(dataset="lastfm", min_user_interactions=1, min_item_interactions=1)
    with caplog.at_level("WARNING", logger="seqrec.data.prepare"):
        prepare(config, tmp_path, use_cache=False)
    assert "lastfm in " in caplog.text
    assert (
        "holds 2 users / 4 items / 6 interactions, not the published 1,090 / 3,646 / 52,551"
        in caplog.text
    )
