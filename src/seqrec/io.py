"""Atomic writes: write to a temporary file (or folder) beside the target, then rename over."""

from __future__ import annotations

import errno
import math
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any


@contextmanager
def atomic_path(target: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; on success it is fsynced and renamed onto it.

    On any error the temporary file is removed and ``target`` is left as it was. The file gets
    the mode ``open`` would give a new file (``0o666`` less the umask), or keeps the mode of
    the regular file it replaces. A symlink is followed: the file it points to is replaced.
    A target that exists and is not a regular file (a FIFO, a terminal), or a descriptor link
    such as ``/dev/stdout``, is not replaced: it is yielded itself and written in place.
    OS errors name ``target``, not the hidden file.
    """
    try:
        mode: int | None = target.stat().st_mode  # follows symlinks, like open() would
    except FileNotFoundError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))
    if written_in_place(target):
        yield target
        return
    if target.is_symlink():
        target = target.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _new_file_beside(target)
    try:
        yield tmp
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp, stat.S_IMODE(mode))
        os.replace(tmp, target)
    except OSError as err:
        if err.filename != str(tmp):
            raise
        raise OSError(err.errno, err.strerror, str(target)) from err
    finally:
        tmp.unlink(missing_ok=True)


def written_in_place(target: Path) -> bool:
    """Whether ``atomic_path`` writes ``target`` itself: an existing FIFO, device or other file
    that is not regular, or a descriptor link (``/dev/stdout``, ``/dev/fd/3``,
    ``/proc/self/fd/1``), which may name a regular file a shell opened for the command: replacing
    that file would detach it from the descriptor."""
    try:
        mode = target.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return False
    if stat.S_ISDIR(mode):
        return False
    return not stat.S_ISREG(mode) or target.absolute().parts[1:2] in (("dev",), ("proc",))


def _new_file_beside(target: Path) -> Path:
    """A new empty hidden file next to ``target``, created with mode ``0o666`` so that the
    kernel applies the umask (and default ACLs) exactly as for ``open``; mkstemp gives 0600."""
    while True:
        tmp = _new_name_beside(target, "tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue  # a name another writer holds: draw again
        except OSError as err:
            raise OSError(err.errno, err.strerror, str(target)) from err
        return tmp


def atomic_write(target: Path, write: Callable[[Path], None]) -> None:
    with atomic_path(target) as tmp:
        write(tmp)


def atomic_write_text(target: Path, text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text)


def atomic_write_bytes(target: Path, data: bytes) -> None:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)


@contextmanager
def atomic_folder(target: Path, keep_existing: Callable[[Path], bool]) -> Iterator[Path]:
    """Yield a new empty folder beside ``target``; on success it is renamed onto ``target`` whole.

    Readers see no folder or a complete one, and processes writing the same folder at once
    (two trainings started together on one dataset, the first rank of every node of a
    ``torchrun`` job sharing a file system) never mix their files. When ``target`` already
    exists, ``keep_existing(target)`` decides: True keeps it and drops the new folder (another
    writer finished first), False moves it aside and puts the new one in its place. On any
    error the new folder is removed and ``target`` is left as it was.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(target)
    staging = _new_name_beside(target, "tmp")
    try:
        os.mkdir(staging, 0o777)  # the mode mkdir gives, less the umask; mkdtemp gives 0700
        yield staging
        _publish(staging, target, keep_existing)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _publish(staging: Path, target: Path, keep_existing: Callable[[Path], bool]) -> None:
    if _renamed(staging, target) or keep_existing(target):
        return
    stale = _new_name_beside(target, "stale")
    with suppress(FileNotFoundError):  # another writer moved it aside first
        os.rename(target, stale)
    try:
        _renamed(staging, target)  # False: another writer's folder came in between, and stays
    finally:
        shutil.rmtree(stale, ignore_errors=True)


def _renamed(source: Path, target: Path) -> bool:
    """Rename a folder onto ``target``; False when ``target`` exists and is not empty."""
    try:
        os.rename(source, target)
    except OSError as err:
        if err.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return False
        raise
    return True


# A staging or set-aside folder this old was left by a writer that was killed; a live
# writer's is minutes old.
ABANDONED_AFTER_SECONDS = 24 * 3600


def _remove_abandoned(target: Path) -> None:
    now = time.time()
    for pattern in (f".{target.name}.*.tmp", f".{target.name}.*.stale"):
        for leftover in target.parent.glob(pattern):
            with suppress(OSError):
                if leftover.is_dir() and now - leftover.stat().st_mtime > ABANDONED_AFTER_SECONDS:
                    shutil.rmtree(leftover, ignore_errors=True)


def _new_name_beside(target: Path, suffix: str) -> Path:
    return target.with_name(f".{target.name}.{secrets.token_hex(4)}.{suffix}")


def standard_json(obj: Any) -> Any:
    """``obj`` with every NaN and infinity as None: Python writes them as NaN and Infinity,
    which no standard JSON reader accepts (a confidence interval over one user is NaN)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {key: standard_json(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [standard_json(value) for value in obj]
    return obj
