"""``seqrec recommend``: one history or a batch file, original item ids in and out."""

from __future__ import annotations

import io
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from seqrec.cli import RECOMMEND_FIELDS, main
from tests.cli.helpers import SEQREC, cli_env, one_error_line, read_jsonl, run_seqrec


def recommend_json(capsys: pytest.CaptureFixture[str], run: Path, *args: str) -> dict[str, Any]:
    assert main(["recommend", str(run), *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def items(log: pl.DataFrame) -> list[str]:
    """Every original item id, most frequent first."""
    return log["item_id"].value_counts(sort=True)["item_id"].to_list()


def test_single_history_gets_k_original_ids_never_from_the_history(
    file_run: Path, items: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    history = items[:8]  # the most popular items: a model would like to recommend them
    rec = recommend_json(capsys, file_run, "--history", *history, "-k", "5")
    assert len(rec["items"]) == len(set(rec["items"])) == 5
    assert set(rec["items"]) <= set(items)
    assert not set(rec["items"]) & set(history)
    assert rec["unknown"] == []
    assert rec["scores"] == sorted(rec["scores"], reverse=True)

    assert main(["recommend", str(file_run), "--history", *history, "-k", "5"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["rank", "item", "score"]
    assert [line.split()[1] for line in table[1:]] == rec["items"]


def test_keep_seen_allows_history_items(
    file_run: Path, items: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    history = items[:8]
    everything = recommend_json(
        capsys, file_run, "--history", *history, "-k", str(len(items)), "--keep-seen"
    )
    assert sorted(everything["items"]) == sorted(items)


def test_unknown_items_are_reported_and_the_rest_answered(
    file_run: Path, items: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    history = ["nope-1", items[3], "nope-2", items[10]]
    assert main(["recommend", str(file_run), "--history", *history, "-k", "4", "--json"]) == 0
    captured = capsys.readouterr()
    rec = json.loads(captured.out)
    assert len(rec["items"]) == 4
    assert rec["unknown"] == ["nope-1", "nope-2"]
    assert captured.err.strip() == "warning: unknown item ids ignored: nope-1 nope-2"
    known_only = recommend_json(capsys, file_run, "--history", items[3], items[10], "-k", "4")
    assert rec["items"] == known_only["items"]


@pytest.mark.parametrize(
    ("history", "reason"),
    [
        (["nope-1", "nope-2"], r"no known item in the history \(unknown item ids: nope-1 nope-2\)"),
        ([""], "empty history"),
    ],
    ids=["all-unknown", "empty"],
)
def test_a_history_without_known_items_fails_with_one_reason(
    file_run: Path, capsys: pytest.CaptureFixture[str], history: list[str], reason: str
) -> None:
    assert main(["recommend", str(file_run), "--history", *history]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "Traceback" not in captured.err
    errors = [line for line in captured.err.splitlines() if line.startswith("error")]
    assert len(errors) == 1, captured.err
    assert re.fullmatch(f"error: cannot recommend: {reason}", errors[0]), errors


def test_batch_writes_one_json_line_per_input_line(
    file_run: Path, items: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [" ".join(items[:3]), f"{items[5]},{items[6]}", " ".join(items[20:60])]
    source, target = tmp_path / "in.txt", tmp_path / "out.jsonl"
    source.write_text("\n".join(lines) + "\n")
    assert main(["recommend", str(file_run), "--input", str(source), "--output", str(target)]) == 0
    rows = read_jsonl(target)
    assert [row["line"] for row in rows] == [1, 2, 3]
    capsys.readouterr()
    for row, line in zip(rows, lines, strict=True):
        history = line.replace(",", " ").split()
        assert row["error"] is None
        assert row["unknown"] == []
        assert row["items"] == recommend_json(capsys, file_run, "--history", *history)["items"]
        assert row["scores"] == pytest.approx(
            recommend_json(capsys, file_run, "--history", *history)["scores"], abs=1e-5
        )


def test_batch_lines_may_be_json_lists_of_ids(
    file_run: Path, items: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """For ids that hold spaces or commas; a line that is not a JSON list of ids is plain."""
    source, target = tmp_path / "in.txt", tmp_path / "out.jsonl"
    source.write_text(f'{json.dumps(items[:3])}\n["{items[4]}", "no such item"]\n')
    done = run_seqrec("recommend", file_run, "--input", source, "--output", target, "-k", "3")
    assert done.returncode == 0, done.stderr
    rows = read_jsonl(target)
    capsys.readouterr()
    alone = recommend_json(capsys, file_run, "--history", *items[:3], "-k", "3")
    assert rows[0]["items"] == alone["items"]
    assert rows[1]["unknown"] == ["no such item"]
    source.write_text(f"[UNK] {items[1]}\n[1, true]\n[1, null, 2]\n")
    done = run_seqrec("recommend", file_run, "--input", source, "--output", target)
    assert done.returncode == 3  # the JSON lists of other values are malformed lines
    rows = read_jsonl(target)
    assert rows[0]["unknown"] == ["[UNK]"]  # not JSON: plain ids
    assert rows[1]["error"] == "a JSON list of ids holds strings and integers only, got [1, true]"
    assert rows[2]["error"].endswith("got [1, null, 2]")  # once the ids "[1", "null" and "2]"
    assert rows[1]["items"] == rows[2]["items"] == []


def test_batch_lines_may_be_csv_lines_and_the_file_may_start_with_a_bom(
    file_run: Path, items: list[str], tmp_path: Path
) -> None:
    source, target = tmp_path / "in.txt", tmp_path / "out.jsonl"
    lines = [
        f"{items[0]} {items[1]}",
        f'"{items[0]}", {items[1]}',  # quotes and a space after the comma
        f"{items[0]},no such item",  # a comma: the space belongs to the id
        f'"{items[0]}" "no such"',  # no comma: quotes keep an id's spaces
    ]
    source.write_text("\n".join(lines) + "\n", encoding="utf-8-sig")
    done = run_seqrec("recommend", file_run, "--input", source, "--output", target, "-k", "3")
    assert done.returncode == 0, done.stderr
    rows = read_jsonl(target)
    assert rows[0]["unknown"] == []  # the BOM is not part of the first id
    assert rows[1]["items"] == rows[0]["items"]
    assert rows[2]["unknown"] == ["no such item"]
    assert rows[3]["unknown"] == ["no such"]
    assert rows[3]["items"] == rows[2]["items"]
    assert "wrote 4 lines to" in done.stderr


def test_only_newlines_end_an_input_line(file_run: Path, items: list[str], tmp_path: Path) -> None:
    """A form feed, a lone CR or U+0085 (which a Latin-1 id can hold) once split a line, and the
    output rows no longer matched the input lines."""
    source, target = tmp_path / "in.txt", tmp_path / "out.jsonl"
    lines = [
        f"{items[0]} {items[1]}\x0c{items[2]}",
        f'["{items[3]}", "a\u0085b"]',
        f"{items[4]}\r{items[5]}",
        f"{items[6]} {items[7]}\r",  # CRLF
    ]
    source.write_text("\n".join(lines) + "\n")
    done = run_seqrec("recommend", file_run, "--input", source, "--output", target, "-k", "3")
    assert done.returncode == 0, done.stderr
    rows = read_jsonl(target)
    assert [row["line"] for row in rows] == [1, 2, 3, 4]
    assert rows[1]["unknown"] == ["a\u0085b"]
    assert rows[2]["unknown"] == []  # inside a line a lone CR separates ids, as a space does
    assert rows[3]["unknown"] == []  # the CR of a CRLF ending is not part of the last id


def test_a_quote_that_never_closes_is_a_malformed_line(
    file_run: Path, items: list[str], tmp_path: Path
) -> None:
    """It was read as if the quote were not there."""
    source, target = tmp_path / "in.txt", tmp_path / "out.jsonl"
    source.write_text(f'{items[0]} {items[1]} "{items[2]}\n{items[0]}\n')
    done = run_seqrec("recommend", file_run, "--input", source, "--output", target)
    assert done.returncode == 3
    assert "error: 1 lines had no usable history (lines 1)" in done.stderr
    rows = read_jsonl(target)
    assert rows[0]["error"] == f'a quote never closes in {items[0]} {items[1]} "{items[2]}'
    assert rows[1]["error"] is None


def test_input_dash_is_stdin(file_run: Path, items: list[str], tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text(f"{items[0]} {items[1]}\n")
    from_file = run_seqrec("recommend", file_run, "--input", source, "--output", "-")
    done = subprocess.run(
        [str(SEQREC), "recommend", str(file_run), "--input", "-", "--output", "-"],
        input=source.read_bytes(),
        capture_output=True,
        env=cli_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == from_file.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--history", "H", "--output", "OUT"], "recommend: --output goes with --input FILE"),
        (["--input", "IN", "--output", "OUT", "--json"], "recommend: --json goes with --history"),
        (["--input", "IN", "--output", ""], "--output is empty: give a file name"),
    ],
    ids=["output-with-history", "json-with-input", "empty-output"],
)
def test_flags_that_would_be_ignored_are_refused(
    file_run: Path,
    items: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    """--output beside --history printed the table, wrote nothing and exited 0."""
    source = tmp_path / "in.txt"
    source.write_text(f"{items[0]}\n")
    given = {"H": items[0], "IN": str(source), "OUT": str(tmp_path / "out.jsonl")}
    assert main(["recommend", str(file_run), *[given.get(a, a) for a in args]]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: {message}")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in.txt"]


def test_options_are_not_abbreviated_and_k_has_a_long_form(
    file_run: Path, items: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--k`` once meant ``--keep-seen`` (an abbreviation) and turned filtering off."""
    history = items[:8]
    rec = recommend_json(capsys, file_run, "--history", *history, "--k", "3")
    assert len(rec["items"]) == 3
    assert not set(rec["items"]) & set(history)
    with pytest.raises(SystemExit):
        main(["recommend", str(file_run), "--history", *history, "--keep", "-k", "3"])
    assert "unrecognized arguments: --keep" in capsys.readouterr().err


def test_unknown_ids_holding_spaces_are_quoted_in_messages(
    file_run: Path, items: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["recommend", str(file_run), "--history", items[0], "no such", "-q"]) == 0
    assert 'unknown item ids ignored: ["no such"]' in capsys.readouterr().err


class FailingStdout(io.StringIO):
    """stdout over ``descriptor`` whose every write fails as a closed pipe's does."""

    def __init__(self, descriptor: int) -> None:
        super().__init__()
        self.descriptor = descriptor

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self) -> int:
        return self.descriptor


def test_output_into_a_reader_that_stopped_early_is_no_error(
    file_run: Path,
    items: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``seqrec recommend ... | head -1``: no message, and the status a shell gives a process
    that SIGPIPE ended; a broken pipe that is not stdout's stays an error."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone
    try:
        monkeypatch.setattr(sys, "stdout", FailingStdout(write_end))
        assert main(["recommend", str(file_run), "--history", items[0]]) == 141
    finally:
        os.close(write_end)
    assert capsys.readouterr().err == ""
    read_end, write_end = os.pipe()  # a reader still there: the pipe that broke is another
    try:
        monkeypatch.setattr(sys, "stdout", FailingStdout(write_end))
        assert main(["recommend", str(file_run), "--history", items[0]]) == 2
    finally:
        os.close(read_end)
        os.close(write_end)
    assert "error: [Errno 32] Broken pipe" in capsys.readouterr().err


def test_batch_output_replaces_only_an_earlier_output(
    file_run: Path, items: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--output RUN/config.json`` once replaced the run's config and said "wrote 1 lines"."""
    source = tmp_path / "in.txt"
    source.write_text(" ".join(items[:3]) + "\n")
    earlier = tmp_path / "out.jsonl"
    for _ in range(2):  # the second run replaces the first one's output
        assert (
            main(["recommend", str(file_run), "--input", str(source), "--output", str(earlier)])
            == 0
        )
    assert list(read_jsonl(earlier)[0]) == list(RECOMMEND_FIELDS)
    capsys.readouterr()
    for precious in (file_run / "config.json", tmp_path / "notes.txt"):
        if not precious.exists():
            precious.write_text("my notes\n")
        before = precious.read_bytes()
        code = main(["recommend", str(file_run), "--input", str(source), "--output", str(precious)])
        assert code == 2
        line = one_error_line(capsys.readouterr().err)
        assert "exists and is not an earlier output of seqrec recommend" in line
        assert precious.read_bytes() == before


def test_batch_output_into_a_reader_that_stops_early_is_not_reported_complete(
    file_run: Path, items: list[str], tmp_path: Path
) -> None:
    """Megabytes into ``| head -c 100``: the whole output went in one write, which the pipe
    cut short without an error, and the command said "wrote 3000 lines" with exit 0."""
    source = tmp_path / "histories.txt"
    source.write_text("".join(f"{items[i % 5]} {items[i % 7 + 5]}\n" for i in range(3000)))
    command = [str(SEQREC), "recommend", str(file_run), "--input", str(source), "--output", "-"]
    reader = subprocess.Popen(
        [*command, "-k", "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env()
    )
    assert reader.stdout is not None
    assert reader.stderr is not None
    assert len(reader.stdout.read(100)) == 100
    reader.stdout.close()  # the reader goes, about 1 MB before the end
    assert reader.wait(timeout=300) == 141
    assert "wrote" not in reader.stderr.read().decode()


def test_batch_with_bad_lines_exits_3_and_marks_them(
    file_run: Path, items: list[str], tmp_path: Path
) -> None:
    source, target = tmp_path / "in.txt", tmp_path / "out.jsonl"
    source.write_text(f"{items[0]} {items[1]}\nzz yy\n\n{items[2]} zz\n")
    done = run_seqrec("recommend", file_run, "--input", source, "--output", target, "-k", "3")
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    assert "error: 2 lines had no usable history (lines 2, 3)" in done.stderr
    rows = read_jsonl(target)
    assert len(rows) == 4
    assert [row["error"] is None for row in rows] == [True, False, False, True]
    assert rows[1]["error"] == "no known item in the history"
    assert rows[1]["unknown"] == ["zz", "yy"]
    assert rows[2]["error"] == "empty history"
    assert rows[3]["unknown"] == ["zz"]
    assert len(rows[3]["items"]) == 3
    assert not list(tmp_path.glob(".*.tmp"))


def test_batch_input_must_exist(
    file_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--input", str(tmp_path / "missing.txt"), "--output", str(tmp_path / "o")]
    assert main(["recommend", str(file_run), *args]) == 2
    assert "missing.txt does not exist" in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "o").exists()


def batch_error(capsys: pytest.CaptureFixture[str], run: Path, source: Path, output: Path) -> str:
    """``recommend --input source --output output``: exit 2, one error line, returned."""
    assert main(["recommend", str(run), "--input", str(source), "--output", str(output)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return one_error_line(captured.err)


@pytest.mark.parametrize("how", ["same-path", "symlink"])
def test_output_that_is_the_input_is_refused(
    file_run: Path, items: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    source = tmp_path / "in.txt"
    source.write_text(f"{items[0]} {items[1]}\n")
    output = source
    if how == "symlink":
        output = tmp_path / "out.jsonl"
        output.symlink_to(source)
    line = batch_error(capsys, file_run, source, output)
    assert line == f"error: --output {output} is the --input file; it would overwrite the input"
    assert source.read_text() == f"{items[0]} {items[1]}\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty; give one history per line"),
        (b"i1 \xff\xfe i2\n", "is not UTF-8 text (invalid start byte at byte 3)"),
        (None, "is a directory, not a file of histories"),
    ],
    ids=["empty", "not-utf8", "directory"],
)
def test_bad_input_file_is_named(
    file_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: bytes | None,
    message: str,
) -> None:
    source = tmp_path / "in.txt"
    if content is None:
        source.mkdir()
    else:
        source.write_bytes(content)
    line = batch_error(capsys, file_run, source, tmp_path / "out.jsonl")
    assert line == f"error: --input {source} {message}"
    assert not (tmp_path / "out.jsonl").exists()


def test_output_that_is_a_directory_is_refused(
    file_run: Path, items: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.txt"
    source.write_text(f"{items[0]}\n")
    line = batch_error(capsys, file_run, source, tmp_path)
    assert line == f"error: --output {tmp_path}: is a directory, not a file"


def test_output_dash_is_stdout(
    file_run: Path,
    items: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # where a file named "-" would appear
    source = tmp_path / "in.txt"
    source.write_text(f"{items[0]} {items[1]}\n{items[2]}\n")
    assert main(["recommend", str(file_run), "--input", str(source), "--output", "-"]) == 0
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()]
    assert [row["line"] for row in rows] == [1, 2]
    assert "wrote 2 lines to stdout" in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_output_symlink_is_kept_and_its_file_written(
    file_run: Path, items: list[str], tmp_path: Path
) -> None:
    source, real, link = tmp_path / "in.txt", tmp_path / "real.jsonl", tmp_path / "link.jsonl"
    source.write_text(f"{items[0]}\n")
    real.write_text("")  # an empty file, or an earlier output, may be replaced
    link.symlink_to(real.name)
    assert main(["recommend", str(file_run), "--input", str(source), "--output", str(link)]) == 0
    assert link.is_symlink()
    assert [row["line"] for row in read_jsonl(real)] == [1]


def test_output_fifo_is_written_not_replaced(
    file_run: Path, items: list[str], tmp_path: Path
) -> None:
    source, fifo = tmp_path / "in.txt", tmp_path / "out.fifo"
    source.write_text(f"{items[0]}\n{items[1]}\n")
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so that the writer's open returns
    try:
        args = ["--input", str(source), "--output", str(fifo)]
        assert main(["recommend", str(file_run), *args]) == 0
        text = os.read(reader, 1 << 16).decode()
    finally:
        os.close(reader)
    assert [json.loads(line)["line"] for line in text.splitlines()] == [1, 2]
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_the_table_pads_ids_by_their_width_on_a_terminal() -> None:
    from seqrec.cli import _display_width, _left

    assert [_display_width(t) for t in ("abc", "商品", "e\u0301")] == [3, 4, 1]
    assert {_display_width(_left(t, 8)) for t in ("abc", "商品", "e\u0301")} == {8}
