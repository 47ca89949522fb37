"""Atomic writes: modes as ``open`` gives them, symlinks and FIFOs kept, errors name the target;
folders published whole, however many writers race for one."""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from seqrec.cli import _metric_table
from seqrec.io import atomic_folder, atomic_path, atomic_write_text, standard_json


@pytest.fixture
def umask_027() -> Iterator[None]:
    old = os.umask(0o027)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("umask_027")
def test_a_new_file_gets_the_mode_open_would_give(tmp_path: Path) -> None:
    atomic_write_text(tmp_path / "new.txt", "x")
    (tmp_path / "plain.txt").write_text("x")
    assert mode(tmp_path / "new.txt") == mode(tmp_path / "plain.txt") == 0o640


@pytest.mark.usefixtures("umask_027")
def test_a_replaced_file_keeps_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "shared.txt"
    target.write_text("old")
    target.chmod(0o664)
    atomic_write_text(target, "new")
    assert target.read_text() == "new"
    assert mode(target) == 0o664


def test_a_symlink_is_kept_and_the_file_it_points_to_replaced(tmp_path: Path) -> None:
    real, link = tmp_path / "real.txt", tmp_path / "link.txt"
    real.write_text("old")
    link.symlink_to(real.name)
    atomic_write_text(link, "new")
    assert link.is_symlink()
    assert real.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.txt", "real.txt"]


def test_a_fifo_is_written_in_place(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so that the writer's open returns
    try:
        atomic_write_text(fifo, "through the pipe\n")
        assert os.read(reader, 1024) == b"through the pipe\n"
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]


def test_a_directory_target_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "out.csv").mkdir()
    with pytest.raises(IsADirectoryError) as caught:
        atomic_write_text(tmp_path / "out.csv", "x")
    assert caught.value.filename == str(tmp_path / "out.csv")


def test_an_error_while_writing_names_the_target_and_leaves_no_file(tmp_path: Path) -> None:
    target = tmp_path / "ranks.csv"
    target.write_text("kept")
    with pytest.raises(OSError, match="No space left") as caught, atomic_path(target) as tmp:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))
    assert caught.value.filename == str(target)
    assert target.read_text() == "kept"
    assert [p.name for p in tmp_path.iterdir()] == ["ranks.csv"]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux /proc")
def test_a_descriptor_link_to_a_regular_file_is_written_in_place(tmp_path: Path) -> None:
    held = tmp_path / "held.txt"
    with open(held, "w") as handle:  # as the shell holds the file of `> held.txt`
        inode = held.stat().st_ino
        atomic_write_text(Path(f"/proc/self/fd/{handle.fileno()}"), "written through fd\n")
    assert held.read_text() == "written through fd\n"
    assert held.stat().st_ino == inode


def fill(folder: Path, writer: str, files: int = 3) -> None:
    for index in range(files):
        (folder / f"part{index}.txt").write_text(writer)


def writers_in(folder: Path) -> set[str]:
    return {p.read_text() for p in folder.iterdir()}


@pytest.mark.usefixtures("umask_027")
def test_a_folder_is_published_whole_with_the_mode_mkdir_gives(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "entry"
    with atomic_folder(target, keep_existing=lambda _: True) as staging:
        fill(staging, "a")
        assert not target.exists()  # nothing is visible before the folder is complete
    assert writers_in(target) == {"a"}
    assert len(list(target.iterdir())) == 3
    (tmp_path / "plain").mkdir()
    assert mode(target) == mode(tmp_path / "plain") == 0o750
    assert [p.name for p in target.parent.iterdir()] == ["entry"]


@pytest.mark.parametrize("keep", [True, False])
def test_an_existing_folder_is_kept_or_replaced_as_the_check_says(
    tmp_path: Path, keep: bool
) -> None:
    target = tmp_path / "entry"
    target.mkdir()
    fill(target, "old", files=5)
    checked: list[Path] = []

    def keep_existing(folder: Path) -> bool:
        checked.append(folder)
        return keep

    with atomic_folder(target, keep_existing) as staging:
        fill(staging, "new")
    assert checked == [target]
    assert writers_in(target) == {"old" if keep else "new"}
    assert len(list(target.iterdir())) == (5 if keep else 3)  # whole folders, never mixed
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]  # no staging or stale folder left


def test_an_error_while_filling_a_folder_leaves_the_target_as_it_was(tmp_path: Path) -> None:
    target = tmp_path / "entry"
    target.mkdir()
    fill(target, "old")

    def fail_halfway() -> None:
        with atomic_folder(target, lambda _: False) as staging:
            fill(staging, "new")
            raise RuntimeError("disk gone")

    with pytest.raises(RuntimeError, match="disk"):
        fail_halfway()
    assert writers_in(target) == {"old"}
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]


def test_writers_racing_for_one_folder_leave_one_writers_whole_folder(tmp_path: Path) -> None:
    target = tmp_path / "entry"
    writers = 8
    start = threading.Barrier(writers)

    def write(writer: int) -> None:
        start.wait()
        # a folder whose files are not all one writer's counts as damaged, as a cache would
        with atomic_folder(target, keep_existing=lambda f: len(writers_in(f)) == 1) as staging:
            for index in range(20):
                (staging / f"part{index}.txt").write_text(str(writer))

    with ThreadPoolExecutor(writers) as pool:
        list(pool.map(write, range(writers)))
    assert len(writers_in(target)) == 1
    assert len(list(target.iterdir())) == 20
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]


def test_folders_a_killed_writer_left_are_removed_once_old(tmp_path: Path) -> None:
    target = tmp_path / "entry"
    old, recent = tmp_path / ".entry.0badc0de.tmp", tmp_path / ".entry.1badc0de.stale"
    for leftover in (old, recent):
        leftover.mkdir()
        fill(leftover, "killed")
    long_ago = time.time() - 2 * 24 * 3600
    os.utime(old, (long_ago, long_ago))
    with atomic_folder(target, keep_existing=lambda _: True) as staging:
        fill(staging, "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        recent.name,
        "entry",
    ]  # a live writer's may be young


def test_standard_json_writes_non_finite_numbers_as_null() -> None:
    """Python writes NaN and Infinity, which standard JSON readers refuse (a confidence
    interval over one user is NaN)."""
    obj = {"a": float("nan"), "b": [1.5, float("-inf"), {"c": float("inf")}], "d": (2, "x")}
    text = json.dumps(standard_json(obj), allow_nan=False)
    assert json.loads(text) == {"a": None, "b": [1.5, None, {"c": None}], "d": [2, "x"]}


def test_the_results_table_says_n_a_where_there_is_no_interval() -> None:
    table = _metric_table({"HR@10": 1.0}, {"HR@10": float("nan")}, [10])
    assert table.splitlines()[1].split() == ["10", "1.0000", "±", "n/a"]
