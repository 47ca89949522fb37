"""Downloads against a real HTTP server on 127.0.0.1 (ephemeral port); never the internet."""

from __future__ import annotations

import gzip
import hashlib
import io
import logging
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from seqrec.data import datasets
from seqrec.data.datasets import DatasetSpec, Download, LocalFile, locate_dataset
from seqrec.data.download import download_file
from seqrec.data.schema import DataError

RATINGS = b"".join(
    f"{u}::{i}::4::{1000 + u * 10 + i}\n".encode() for u in range(5) for i in range(6)
)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def zipped(member: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("ml/README", b"not this one")
        zf.writestr(member, data)
    return buffer.getvalue()


ARCHIVE = zipped("ml/ratings.dat", RATINGS)


@dataclass
class Server:
    url: str
    hits: dict[str, int] = field(default_factory=dict)


def make_handler(hits: dict[str, int]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits[self.path] = hits.get(self.path, 0) + 1
            if self.path == "/ratings.dat":
                self.reply(RATINGS)
            elif self.path == "/ml.zip":
                self.reply(ARCHIVE)
            elif self.path == "/ratings.dat.gz":
                self.reply(gzip.compress(RATINGS))
            elif self.path == "/flaky.zip" and hits[self.path] == 1:
                # Promise the whole archive, send half, hang up.
                self.send_response(200)
                self.send_header("Content-Length", str(len(ARCHIVE)))
                self.end_headers()
                self.wfile.write(ARCHIVE[: len(ARCHIVE) // 2])
                self.wfile.flush()
                self.close_connection = True
            elif self.path == "/flaky.zip":
                self.reply(ARCHIVE)
            elif self.path == "/flaky.dat" and hits[self.path] == 1:
                self.send_response(200)
                self.send_header("Content-Length", str(len(RATINGS) + 1000))
                self.end_headers()
                self.wfile.write(RATINGS)
                self.close_connection = True
            elif self.path == "/flaky.dat":
                self.reply(RATINGS)
            else:
                self.send_error(404)

        def reply(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # keep the test output clean

    return Handler


@pytest.fixture
def server() -> Iterator[Server]:
    hits: dict[str, int] = {}
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(hits))
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield Server(f"http://127.0.0.1:{httpd.server_address[1]}", hits)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_plain_download_is_verified_and_kept(server: Server, tmp_path: Path) -> None:
    dest = tmp_path / "ml" / "ratings.dat"
    download_file(f"{server.url}/ratings.dat", dest, sha256=sha(RATINGS), timeout=5)
    assert dest.read_bytes() == RATINGS
    assert listing(dest.parent) == ["ratings.dat"]


def test_zip_member_is_extracted_checksum_is_of_the_archive(server: Server, tmp_path: Path) -> None:
    dest = tmp_path / "ratings.dat"
    download_file(
        f"{server.url}/ml.zip",
        dest,
        sha256=sha(ARCHIVE),
        extract="zip",
        member="ml/ratings.dat",
        timeout=5,
    )
    assert dest.read_bytes() == RATINGS
    assert listing(tmp_path) == ["ratings.dat"]  # the archive itself is not kept


def test_gzip_is_extracted(server: Server, tmp_path: Path) -> None:
    dest = tmp_path / "ratings.dat"
    body = gzip.compress(RATINGS)
    download_file(f"{server.url}/ratings.dat.gz", dest, sha256=sha(body), extract="gzip")
    assert dest.read_bytes() == RATINGS


def test_checksum_mismatch_names_both_digests_and_keeps_nothing(
    server: Server, tmp_path: Path
) -> None:
    wrong = "0" * 64
    with pytest.raises(DataError, match=rf"expected sha256 {wrong}, got {sha(ARCHIVE)}"):
        download_file(
            f"{server.url}/ml.zip",
            tmp_path / "ratings.dat",
            sha256=wrong,
            extract="zip",
            member="ml/ratings.dat",
        )
    assert listing(tmp_path) == []


def test_connection_cut_keeps_nothing_and_a_retry_succeeds(server: Server, tmp_path: Path) -> None:
    dest = tmp_path / "ratings.dat"

    def fetch() -> None:
        download_file(
            f"{server.url}/flaky.zip",
            dest,
            sha256=sha(ARCHIVE),
            extract="zip",
            member="ml/ratings.dat",
            timeout=5,
        )

    with pytest.raises(DataError, match=r"cut off: got \d[\d,]* of [\d,]+ bytes"):
        fetch()
    assert listing(tmp_path) == []
    fetch()
    assert dest.read_bytes() == RATINGS
    assert server.hits["/flaky.zip"] == 2
    assert listing(tmp_path) == ["ratings.dat"]


def test_plain_download_cut_keeps_nothing(server: Server, tmp_path: Path) -> None:
    dest = tmp_path / "ratings.dat"
    with pytest.raises(DataError, match=r"cut off"):
        download_file(f"{server.url}/flaky.dat", dest, sha256=sha(RATINGS), timeout=5)
    assert listing(tmp_path) == []
    download_file(f"{server.url}/flaky.dat", dest, sha256=sha(RATINGS), timeout=5)
    assert dest.read_bytes() == RATINGS


def test_missing_zip_member_lists_the_members(server: Server, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"no member 'ml-1m/ratings.dat'; it has ml/README"):
        download_file(
            f"{server.url}/ml.zip",
            tmp_path / "ratings.dat",
            sha256=sha(ARCHIVE),
            extract="zip",
            member="ml-1m/ratings.dat",
        )
    assert listing(tmp_path) == []


def test_http_error_is_a_data_error(server: Server, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"HTTP 404"):
        download_file(f"{server.url}/nothing", tmp_path / "x", sha256=None)
    assert listing(tmp_path) == []


def test_a_failed_download_removes_the_folders_it_created(server: Server, tmp_path: Path) -> None:
    """It left an empty downloads/<dataset>/ folder behind."""
    (tmp_path / "kept").mkdir()
    with pytest.raises(DataError, match=r"HTTP 404"):
        download_file(f"{server.url}/nothing", tmp_path / "kept" / "a" / "b" / "x", sha256=None)
    assert listing(tmp_path) == ["kept"]
    assert listing(tmp_path / "kept") == []


def test_unreachable_server_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"download of http://127.0.0.1:9/x failed"):
        download_file("http://127.0.0.1:9/x", tmp_path / "x", sha256=None, timeout=2)


def test_unverified_download_warns_and_records_its_digest(
    server: Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dest = tmp_path / "ratings.dat"
    with caplog.at_level(logging.WARNING, logger="seqrec.data.download"):
        download_file(f"{server.url}/ratings.dat", dest, sha256=None)
    assert "UNVERIFIED" in caplog.text
    record = tmp_path / "ratings.dat.sha256"
    assert record.read_text().split()[0] == sha(RATINGS)


def test_locate_downloads_into_the_cache_once(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = DatasetSpec(
        name="toy",
        description="a toy dataset served locally",
        files=(LocalFile("ratings.dat", "movielens", timestamps=True),),
        download=Download(
            f"{server.url}/ml.zip", "ratings.dat", sha(ARCHIVE), "zip", "ml/ratings.dat"
        ),
        citation="none",
    )
    monkeypatch.setitem(datasets.DATASETS, "toy", spec)
    monkeypatch.delenv("SEQREC_OFFLINE")
    cache = tmp_path / "cache"
    first = locate_dataset("toy", cache_dir=cache, timeout=5)
    assert first.origin == "downloaded"
    assert first.path == cache / "downloads" / "toy" / "ratings.dat"
    second = locate_dataset("toy", cache_dir=cache, timeout=5)
    assert second.origin == "cache"
    assert server.hits["/ml.zip"] == 1


def test_offline_mode_blocks_downloads(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = DatasetSpec(
        name="toy",
        description="",
        files=(LocalFile("ratings.dat", "movielens", timestamps=True),),
        download=Download(f"{server.url}/ratings.dat", "ratings.dat", sha(RATINGS)),
        citation="none",
    )
    monkeypatch.setitem(datasets.DATASETS, "toy", spec)
    with pytest.raises(DataError, match=r"downloading is off because SEQREC_OFFLINE=1"):
        locate_dataset("toy")
    assert server.hits == {}
