"""The sha256 of a source file's bytes, remembered so that an unchanged file is read once.

The prepared-data cache is keyed on what a file holds, not on its size and modification
time: a rewrite that keeps both (``cp -p``, ``rsync -t``, a restore from a backup) must not
load the old file's arrays. Hashing reads the whole file, so the digest is remembered under
``<cache>/digests/`` for the file's path, size, mtime, ctime and inode. ctime is set by the
kernel on every write and metadata change, and no copy tool can set it back, so a file whose
status is unchanged has unchanged bytes; any change to the status (a chmod too) only costs
one more hash.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path

from seqrec.data.download import sha256_file
from seqrec.io import atomic_write_text

logger = logging.getLogger(__name__)

ANNOUNCED_BYTES = 1 << 30  # hashing this much takes about a second: say why we wait
_DIGEST = re.compile(r"[0-9a-f]{64}")


def content_sha256(path: Path, memo_dir: Path | None) -> str:
    """The file's sha256, from ``memo_dir`` when its status is unchanged since it was last
    hashed there (None: hash it and remember nothing)."""
    status = path.stat()
    memo = memo_dir / _status_key(path, status) if memo_dir is not None else None
    if memo is not None:
        try:
            remembered = memo.read_text().strip()
        except OSError:
            remembered = ""
        if _DIGEST.fullmatch(remembered):
            return remembered
    if status.st_size >= ANNOUNCED_BYTES:
        logger.info("hashing %s (%.1f GB) to find its prepared data", path, status.st_size / 1e9)
    digest = sha256_file(path)
    if memo is not None:
        try:
            atomic_write_text(memo, digest)
        except OSError as err:  # a read-only cache still works, it hashes every time
            logger.debug("cannot remember the digest of %s: %s", path, err)
    return digest


def _status_key(path: Path, status: os.stat_result) -> str:
    fields = (path.resolve(), status.st_size, status.st_mtime_ns, status.st_ctime_ns, status.st_ino)
    return hashlib.sha256("\0".join(map(str, fields)).encode()).hexdigest()[:32]
