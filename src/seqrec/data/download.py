"""Fetch one public file into the local cache: stream, verify sha256, extract, atomic rename.

Checksum rule: a spec's ``sha256`` is always the digest of the bytes **as downloaded**
(the archive itself for ``zip``/``gzip``, the file itself otherwise), checked before
anything is extracted. That is what the published checksums describe (GroupLens' zip,
the raw GitHub files whose digests the shared data READMEs list).

Nothing partial is ever left at the destination: the body is streamed into a temporary
file in the destination folder and renamed only after the byte count and the checksum
are right, so a failed download leaves the folder as it was and a later call retries
from scratch. Where no published checksum exists (``sha256=None``) the file is kept with
a logged warning and the computed digest is recorded next to it as ``<file>.sha256``
(sha256sum format), so later runs and people can see what was verified against nothing.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import logging
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
import zlib
from pathlib import Path
from typing import Literal

from seqrec.data.schema import DataError
from seqrec.io import atomic_path, atomic_write_text

logger = logging.getLogger(__name__)

Extract = Literal["none", "gzip", "zip"]
_CHUNK = 1 << 20
_USER_AGENT = "seqrec/0.1 (dataset download)"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download_file(
    url: str,
    dest: str | Path,
    *,
    sha256: str | None,
    extract: Extract = "none",
    member: str | None = None,
    timeout: float = 60.0,
) -> Path:
    """Download ``url`` to ``dest`` (extracting ``member`` of a zip, or gunzipping).

    Raises ``DataError`` on a network failure, a short body, a checksum mismatch or a bad
    archive; in every such case nothing is left at ``dest`` or beside it.
    """
    dest = Path(dest)
    created = [d for d in (dest.parent, *dest.parent.parents) if not d.exists()]  # deepest first
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        return _download(url, dest, sha256, extract, member, timeout)
    except BaseException:
        for folder in created:  # a failed download leaves no empty folder behind either
            try:
                folder.rmdir()
            except OSError:
                break
        raise


def _download(
    url: str, dest: Path, sha256: str | None, extract: Extract, member: str | None, timeout: float
) -> Path:
    logger.info("downloading %s -> %s", url, dest)
    if extract == "none":
        with atomic_path(dest) as tmp:
            digest = _stream(url, tmp, timeout)
            _verify(url, digest, sha256)
    else:
        fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
        os.close(fd)  # only the name is reserved here; _stream reopens it
        part = Path(name)
        try:
            digest = _stream(url, part, timeout)
            _verify(url, digest, sha256)
            with atomic_path(dest) as tmp:
                _extract(url, part, tmp, extract, member)
        finally:
            part.unlink(missing_ok=True)
    if sha256 is None:
        record = dest.with_name(dest.name + ".sha256")
        atomic_write_text(record, f"{digest}  {url}\n")
        logger.warning(
            "%s has no published checksum, so it is UNVERIFIED; its sha256 %s is recorded in %s",
            url,
            digest,
            record,
        )
    return dest


def _stream(url: str, target: Path, timeout: float) -> str:
    """Write the body of ``url`` to ``target``; return its sha256. Short bodies are errors."""
    digest = hashlib.sha256()
    written = 0
    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    try:
        with (
            urllib.request.urlopen(request, timeout=timeout) as response,
            open(target, "wb") as out,
        ):
            expected = response.headers.get("Content-Length")
            for chunk in iter(lambda: response.read(_CHUNK), b""):
                digest.update(chunk)
                out.write(chunk)
                written += len(chunk)
    except urllib.error.HTTPError as err:
        raise DataError(f"download of {url} failed: HTTP {err.code} {err.reason}") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
        reason = getattr(err, "reason", None) or err
        raise DataError(
            f"download of {url} failed after {written:,} bytes: {reason}; "
            "nothing was kept, run again to retry"
        ) from None
    # http.client does not raise when the server closes before Content-Length: check here.
    if expected is not None and expected.isdigit() and written != int(expected):
        raise DataError(
            f"download of {url} was cut off: got {written:,} of {int(expected):,} bytes; "
            "nothing was kept, run again to retry"
        )
    return digest.hexdigest()


def _verify(url: str, actual: str, expected: str | None) -> None:
    if expected is not None and actual != expected.lower():
        raise DataError(
            f"checksum mismatch for {url}: expected sha256 {expected}, got {actual}; "
            "the file was not kept"
        )


def _extract(url: str, archive: Path, target: Path, extract: Extract, member: str | None) -> None:
    try:
        if extract == "gzip":
            with gzip.open(archive, "rb") as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, _CHUNK)
            return
        with zipfile.ZipFile(archive) as zf:
            names = zf.namelist()
            if member is None or member not in names:
                raise DataError(
                    f"{url}: the zip has no member {member!r}; it has {', '.join(names[:20])}"
                )
            with zf.open(member) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, _CHUNK)
    except (OSError, EOFError, zlib.error, zipfile.BadZipFile) as err:
        raise DataError(f"cannot extract {url}: {err}") from None
