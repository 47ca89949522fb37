"""Interaction files -> a Polars frame ``user_id, item_id[, timestamp][, rating]`` in file order.

Formats (``DataConfig.format``):

* ``csv`` / ``tsv`` / ``parquet``: a table with a header; ``DataConfig.user_column``,
  ``item_column`` and the optional ``timestamp_column`` / ``rating_column`` name the columns.
* ``movielens``: ``user item rating timestamp`` per line, separated by ``::`` (ML-1M
  ``ratings.dat``, Latin-1) or by a tab (ML-100K ``u.data``); the separator is taken from
  the first line.
* ``pairs``: ``user item`` per line (SASRec / BERT4Rec ``*.txt``), whitespace separated.
* ``sequences``: ``user item item ...`` per line (S3-Rec ``*.txt``), oldest item first; one
  line per user (a user on two lines is an error: the file is most likely one interaction per
  line, which is read as a csv/tsv table).

A trailing ``.gz`` is decompressed transparently. A directory is read as the shards of one
log (what Spark or a daily export writes): every file under it, in sub-directories too, in the
plain string order of their paths (``day-10`` before ``day-2``: number shards with leading
zeros when their order is the time order), except hidden files and names starting with ``_``
(``_SUCCESS``, ``_metadata``); its rows are in that order. Symlinked sub-directories are not
followed, and partition directories (``date=2024-01-01``) are not read as columns. Every
shard has the same format (``*.txt`` shards sniffed apart as ``pairs`` and ``sequences`` are
all read as ``sequences``, which reads a pair the same way); empty shards are skipped.

``format: auto`` looks at the file name without ``.gz``: ``*.parquet``, ``*.csv``, ``*.tsv``
name themselves; ``*.dat`` and ``u.data`` are ``movielens``; ``*.txt`` is ``pairs`` when
each of its first 1,000 non-blank lines has exactly two tokens, else ``sequences`` (a
one-item ``sequences`` line *is* a pair, so the two readings agree whenever the sniff could
be fooled); anything else is an error that asks for ``data.format``.

User and item ids stay strings (``Utf8``): files disagree on whether ids are numbers.
Timestamps become Int64: integers are kept as they are (seconds, or milliseconds as some logs
write them), fractional seconds are truncated and ISO date-times converted to epoch seconds.
Rows keep the file order, except when a timestamp has a fraction of a second: the rows are then
stably sorted by the precise time before it is truncated, so that the pipeline's stable sort by
(user, second) keeps the order of events within one second.
Text formats are split with Polars string kernels, not per-token Python.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import logging
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import polars as pl

from seqrec.config import DataConfig, FileFormat, warn_once
from seqrec.data.schema import ITEM_ID, RATING, TIMESTAMP, USER_ID, DataError

logger = logging.getLogger(__name__)

ReadFormat = Literal["csv", "tsv", "parquet", "movielens", "pairs", "sequences"]

_LINE = "line"
_LINE_NO = "line_no"
_TOKENS = "tokens"
_PRECISE_TIMESTAMP = "_precise_timestamp"  # Float64 epoch seconds, until read_interactions ends
_SNIFF_LINES = 1000


@dataclass(frozen=True)
class ColumnMap:
    """Which columns of a csv/tsv/parquet table hold the user, item, timestamp and rating."""

    user: str = USER_ID
    item: str = ITEM_ID
    timestamp: str | None = None
    rating: str | None = None

    @classmethod
    def from_config(cls, config: DataConfig) -> ColumnMap:
        """The ``DataConfig.*_column`` fields."""
        return cls(
            user=config.user_column,
            item=config.item_column,
            timestamp=config.timestamp_column,
            rating=config.rating_column,
        )


def read_interactions(
    path: str | Path, format: FileFormat = "auto", columns: ColumnMap | None = None
) -> pl.DataFrame:
    """Read an interaction file of any supported format, or a directory of shards (see the
    module docstring)."""
    path = Path(path)
    if path.is_dir():
        df = _read_shards(path, format, columns)
    else:
        df = _read_single_file(path, format, columns)
    return _in_precise_time_order(df)


def _read_single_file(path: Path, format: FileFormat, columns: ColumnMap | None) -> pl.DataFrame:
    fmt = detect_format(path) if format == "auto" else format
    try:
        df = _read_file(path, fmt, columns)
    except DataError as err:
        if format != "auto" or fmt in ("csv", "tsv", "parquet"):
            raise
        # .txt and .dat say little: the guess may be what is wrong
        raise DataError(
            f"{err} (read as {fmt}, guessed from the file name; if it is another format, "
            f"set data.format to one of {', '.join(get_args(ReadFormat))})"
        ) from None
    logger.info("read %s (%s): %d interactions", path, fmt, df.height)
    return df


def _in_precise_time_order(df: pl.DataFrame) -> pl.DataFrame:
    """Without the precise time column; its rows stably sorted by it first when a timestamp
    has a fraction of a second, which the Int64 seconds drop."""
    if _PRECISE_TIMESTAMP not in df.columns:
        return df
    precise = pl.col(_PRECISE_TIMESTAMP)
    if df.select((precise != precise.floor()).any()).item():
        df = df.sort(_PRECISE_TIMESTAMP, maintain_order=True)
    return df.drop(_PRECISE_TIMESTAMP)


def _read_file(path: Path, fmt: ReadFormat, columns: ColumnMap | None) -> pl.DataFrame:
    if fmt in ("csv", "tsv", "parquet"):
        return _read_table(path, fmt, columns or ColumnMap())
    if fmt == "movielens":
        return read_movielens(path)
    if fmt == "pairs":
        return read_pairs(path)
    return read_sequences(path)


def shard_files(folder: Path) -> list[Path]:
    """The shards of a directory log, in path order (see the module docstring)."""
    files = [
        path
        for path in folder.rglob("*")
        if path.is_file()
        and not any(part.startswith((".", "_")) for part in path.relative_to(folder).parts)
    ]
    return sorted(files, key=lambda path: path.relative_to(folder).parts)


def _read_shards(folder: Path, format: FileFormat, columns: ColumnMap | None) -> pl.DataFrame:
    shards = shard_files(folder)
    if not shards:
        raise DataError(
            f"directory {folder} holds no interaction file (hidden files and names starting "
            "with '_' are skipped)"
        )
    formats = {shard: detect_format(shard) if format == "auto" else format for shard in shards}
    kinds = set(formats.values())
    if kinds == {"pairs", "sequences"}:  # a sequences shard of one-item lines sniffs as pairs
        kinds = {"sequences"}
    if len(kinds) > 1:
        found = ", ".join(f"{shard.relative_to(folder)}: {fmt}" for shard, fmt in formats.items())
        raise DataError(f"the shards of {folder} have different formats ({found})")
    (fmt,) = kinds
    frames, read = [], []
    for shard in shards:
        if _holds_no_rows(shard, fmt):  # an empty partition, a day without interactions
            logger.info("skipped empty shard %s", shard)
            continue
        frames.append(_read_single_file(shard, fmt, columns))
        read.append(shard)
    if not frames:
        raise DataError(f"every shard of {folder} is empty")
    if fmt == "sequences":
        _refuse_users_in_two_shards(folder, read, frames)
    df = pl.concat(frames, how="vertical")
    logger.info("read %s: %d shards, %d interactions", folder, len(frames), df.height)
    return df


def _refuse_users_in_two_shards(
    folder: Path, shards: list[Path], frames: list[pl.DataFrame]
) -> None:
    """A sequences line is a user's whole history, so a user in two shards would be two
    histories joined in the order of the shards' paths."""
    owners = pl.concat(
        frame.select(USER_ID).unique().with_columns(shard=pl.lit(index))
        for index, frame in enumerate(frames)
    )
    shared = owners.filter(pl.col(USER_ID).is_duplicated()).sort("shard")
    if shared.height == 0:
        return
    user = shared[USER_ID][0]
    first, second = shared.filter(pl.col(USER_ID) == user)["shard"].head(2).to_list()
    raise DataError(
        f"user {user!r} is in two shards of {folder} ({shards[first].relative_to(folder)} and "
        f"{shards[second].relative_to(folder)}), but a sequences line holds a user's whole "
        "history"
    )


def _holds_no_rows(path: Path, fmt: ReadFormat) -> bool:
    """No interaction in the file: no bytes, a parquet file of no rows, or a csv/tsv header
    alone (a file that cannot be read is left to the reader's error)."""
    try:
        if path.stat().st_size == 0:
            return True
        if fmt == "parquet":
            if path.name.endswith(".gz"):
                return pl.read_parquet(io.BytesIO(_read_bytes(path)), n_rows=1).height == 0
            return int(pl.scan_parquet(path).select(pl.len()).collect().item()) == 0
        lines = [line for line in _head_lines(path, size=1 << 16) if line.strip()]
    except (OSError, DataError, pl.exceptions.PolarsError):
        return False
    return len(lines) <= (1 if fmt in ("csv", "tsv") else 0)


def detect_format(path: Path) -> ReadFormat:
    """The ``format: auto`` rule of the module docstring."""
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    suffix = Path(name).suffix.lower()
    by_suffix: dict[str, ReadFormat] = {
        ".parquet": "parquet",
        ".csv": "csv",
        ".tsv": "tsv",
        ".dat": "movielens",
    }
    if suffix in by_suffix:
        return by_suffix[suffix]
    if name == "u.data":
        return "movielens"
    if suffix == ".txt":
        return _sniff_txt(path)
    raise DataError(
        f"cannot tell the format of {path} from its name; set data.format to one of "
        f"{', '.join(get_args(ReadFormat))}"
    )


def _sniff_txt(path: Path) -> ReadFormat:
    lines = [line for line in _head_lines(path) if line.strip()]
    two = all(len(line.split()) == 2 for line in lines[:_SNIFF_LINES])
    return "pairs" if two else "sequences"


def _head_lines(path: Path, size: int = 1 << 18) -> list[str]:
    """The complete lines among the first ``size`` (decompressed) bytes of a text file."""
    if not path.is_file():
        raise DataError(f"file {path} does not exist")
    try:
        with gzip.open(path) if path.name.endswith(".gz") else open(path, "rb") as handle:
            head = handle.read(size)
    except (OSError, EOFError, zlib.error) as err:
        raise DataError(f"cannot read {path}: {err}") from None
    lines = head.decode("utf-8", errors="replace").split("\n")
    return lines[:-1] if len(head) == size else lines


def _read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise DataError(f"file {path} does not exist")
    try:
        data = path.read_bytes()
        if path.name.endswith(".gz"):
            data = gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as err:
        raise DataError(f"cannot read {path}: {err}") from None
    if not data or data.isspace():
        raise DataError(f"file {path} is empty")
    return data


def _read_text(path: Path, encoding: str = "utf-8") -> str:
    data = _read_bytes(path).removeprefix(codecs.BOM_UTF8)  # a BOM is not part of the first id
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as err:
        raise DataError(f"{path} is not valid {encoding} text: {err}") from None


def _tokenize(text: str, separator: str | None) -> pl.DataFrame:
    """Non-blank lines -> (line_no 1-based, line, tokens list). ``None`` = any whitespace."""
    lines = pl.Series(_LINE, [text], dtype=pl.String).str.split("\n").explode()
    df = pl.DataFrame([lines]).with_row_index(_LINE_NO, offset=1)
    df = df.with_columns(pl.col(_LINE).str.strip_chars()).filter(pl.col(_LINE) != "")
    line = pl.col(_LINE)
    if separator is None:
        if "\t" in text or "  " in text:  # the regex pass is only paid for when needed
            line = line.str.replace_all(r"\s+", " ")
        tokens = line.str.split(" ")
    else:
        tokens = line.str.split(separator)
    return df.with_columns(tokens.alias(_TOKENS))


def _malformed(path: Path, df: pl.DataFrame, bad: pl.Expr, expected: str) -> None:
    """Raise for the first row where ``bad`` holds, quoting its line and number."""
    rows = df.filter(bad).select(_LINE_NO, _LINE).head(1)
    if rows.height:
        line_no, line = rows.row(0)
        shown = line if len(line) <= 80 else line[:77] + "..."
        raise DataError(f"{path}:{line_no}: malformed line {shown!r}; expected {expected}")


_HEADER_WORDS = frozenset(
    {"user", "users", "user_id", "userid", "uid", "item", "items", "item_id", "item_ids"}
    | {"itemid", "iid", "sequence"}
)


def _without_header(path: Path, df: pl.DataFrame) -> pl.DataFrame:
    """A first line of column names only (`user_id item_id`), which whitespace formats do not
    have but exports sometimes add, is dropped with a warning instead of becoming a user."""
    if df.height == 0:
        return df
    first = df[_TOKENS][0].to_list()
    if first[0].lower() in _HEADER_WORDS and all(t.lower() in _HEADER_WORDS for t in first):
        logger.warning("%s: skipped its first line %r, a header", path, " ".join(first))
        return df.slice(1)
    return df


def read_pairs(path: str | Path) -> pl.DataFrame:
    """``user item`` per line (SASRec/BERT4Rec), file order kept."""
    path = Path(path)
    df = _without_header(path, _tokenize(_read_text(path), None))
    _malformed(path, df, pl.col(_TOKENS).list.len() != 2, "`user item` (2 fields)")
    return df.select(
        pl.col(_TOKENS).list.get(0).alias(USER_ID), pl.col(_TOKENS).list.get(1).alias(ITEM_ID)
    )


def read_sequences(path: str | Path) -> pl.DataFrame:
    """``user item item ...`` per line (S3-Rec), one row per item, file order kept."""
    path = Path(path)
    df = _without_header(path, _tokenize(_read_text(path), None))
    _malformed(
        path, df, pl.col(_TOKENS).list.len() < 2, "`user item [item ...]` (a user and >= 1 item)"
    )
    _refuse_repeated_users(path, df)
    return df.select(
        pl.col(_TOKENS).list.get(0).alias(USER_ID),
        pl.col(_TOKENS).list.slice(1).alias(ITEM_ID),
    ).explode(ITEM_ID)


def _refuse_repeated_users(path: Path, df: pl.DataFrame) -> None:
    """A user on two lines of a sequences file: most likely a log of one interaction per line
    (``user item timestamp`` sniffs as sequences), whose timestamps would be read as items."""
    users = df.select(_LINE_NO, pl.col(_TOKENS).list.first().alias(USER_ID))
    repeats = users.filter(~pl.col(USER_ID).is_first_distinct()).head(1)
    if repeats.height == 0:
        return
    second_line, user = repeats.row(0)
    first_line = users.filter(pl.col(USER_ID) == user)[_LINE_NO][0]
    if (df[_TOKENS].list.len() == 2).all():
        advice = "a file of one interaction per line (`user item`) is read with data.format: pairs"
    else:
        advice = (
            "a file of one interaction per line (`user item [timestamp]`) is read as a table: "
            "convert it to a csv file with a header row, e.g. `user_id,item_id,timestamp`, "
            "and set data.timestamp_column: timestamp"
        )
    raise DataError(
        f"{path}: user {user!r} is on lines {first_line} and {second_line}, but a sequences "
        f"file (`user item item ...`) holds one line per user; {advice}"
    )


# Column names that say "when": a table that has one but no data.timestamp_column keeps its
# file order, which is most likely not what its author meant.
_TIME_COLUMN_NAMES = ("timestamp", "time", "datetime", "date", "ts")


def _warn_unread_time_column(names: list[str]) -> None:
    time_columns = [name for name in names if name.strip().lower() in _TIME_COLUMN_NAMES]
    if time_columns:
        warn_once(
            f"the table has a column {time_columns[0]!r} but data.timestamp_column is not set: "
            f"each user's rows keep the file order; set data.timestamp_column: "
            f"{time_columns[0]} to order them by time"
        )


def read_movielens(path: str | Path) -> pl.DataFrame:
    """``user::item::rating::timestamp`` (ratings.dat, Latin-1), or tab-separated (u.data)."""
    path = Path(path)
    text = _read_text(path, "latin-1")  # Latin-1 never fails to decode; ids are ASCII anyway
    first = text.lstrip()[:200]
    separator = "::" if "::" in first else "\t"
    df = _tokenize(text, separator)
    shown_sep = "::" if separator == "::" else "<TAB>"
    expected = f"`user{shown_sep}item{shown_sep}rating{shown_sep}timestamp` (4 fields)"
    tokens = pl.col(_TOKENS)
    _malformed(path, df, tokens.list.len() != 4, expected)
    df = df.with_columns(
        tokens.list.get(0).str.strip_chars().alias(USER_ID),
        tokens.list.get(1).str.strip_chars().alias(ITEM_ID),
        tokens.list.get(2).str.strip_chars().cast(pl.Float64, strict=False).alias(RATING),
        tokens.list.get(3).str.strip_chars().cast(pl.Int64, strict=False).alias(TIMESTAMP),
    )
    _malformed(path, df, pl.col(RATING).is_null(), f"{expected} with a numeric rating")
    _malformed(path, df, pl.col(TIMESTAMP).is_null(), f"{expected} with an integer timestamp")
    return df.select(USER_ID, ITEM_ID, TIMESTAMP, RATING)


def read_table(path: str | Path, fmt: ReadFormat, columns: ColumnMap) -> pl.DataFrame:
    """A csv/tsv/parquet table with a header, renamed to the canonical columns (rows in time
    order where timestamps have fractions of a second, else in file order)."""
    return _in_precise_time_order(_read_table(Path(path), fmt, columns))


def _read_table(path: Path, fmt: ReadFormat, columns: ColumnMap) -> pl.DataFrame:
    """``read_table`` with, when there is a timestamp, the precise time as a private column
    that ``read_interactions`` orders the rows by (after joining shards) and drops."""
    wanted = {
        USER_ID: columns.user,
        ITEM_ID: columns.item,
        TIMESTAMP: columns.timestamp,
        RATING: columns.rating,
    }
    needed = [name for name in wanted.values() if name is not None]
    df = _load_parquet(path, needed) if fmt == "parquet" else _load_delimited(path, fmt == "csv")
    for name in needed:  # polars keeps the first and renames the others name_duplicated_0, ...
        if f"{name}_duplicated_0" in df.columns:
            raise DataError(
                f"{path}: the header names column {name!r} more than once; rename the one "
                "that is not meant"
            )
    missing = [name for name in wanted.values() if name is not None and name not in df.columns]
    if missing:
        advice = "" if fmt == "parquet" else _header_problem(df, fmt)
        raise DataError(
            f"{path}: no column(s) {', '.join(map(repr, missing))}; the file has columns "
            f"{', '.join(map(repr, df.columns))}; "
            f"{advice or 'set data.user_column / item_column / timestamp_column / rating_column'}"
        )
    if df.height == 0:
        raise DataError(f"file {path} has a header but no rows")
    if columns.timestamp is None:
        _warn_unread_time_column(df.columns)
    out = df.select(*(pl.col(src).alias(dst) for dst, src in wanted.items() if src is not None))
    for name in (USER_ID, ITEM_ID):
        out = out.with_columns(_to_id(path, out[name], wanted[name] or name))
    if columns.timestamp is not None:
        out = out.with_columns(_to_epoch_seconds(path, out[TIMESTAMP], columns.timestamp))
    if columns.rating is not None:
        out = out.with_columns(_to_float(path, out[RATING], columns.rating))
    return out


def _header_problem(df: pl.DataFrame, fmt: ReadFormat) -> str:
    """Why a csv/tsv header may lack the mapped columns: another delimiter, or no header (then
    mapping the columns to its fields would drop the first data row); "" when neither shows."""
    if df.width == 1:
        own = "," if fmt == "csv" else "\t"
        others = [sep for sep in (";", "|", "\t", ",") if sep != own and sep in df.columns[0]]
        if others:
            shown = "a tab" if others[0] == "\t" else repr(others[0])
            return (
                f"the file's delimiter may be {shown}: csv files are comma-separated, tsv files "
                "tab-separated"
            )
    if _looks_like_data(df):
        return "the first line looks like data: the file needs a header row naming its columns"
    return ""


def _looks_like_data(df: pl.DataFrame, rows: int = 1000) -> bool:
    """At least half the header fields a number or a value that recurs in its column (one
    column may well be named 2024; a header of data has few fields that are only names)."""
    head = df.head(rows)

    def like_data(name: str) -> bool:
        is_number = pl.Series([name]).cast(pl.Float64, strict=False).is_not_null().item()
        return bool(is_number) or name in head[name].cast(pl.String).to_list()

    return 2 * sum(like_data(name) for name in df.columns) >= df.width


def _load_parquet(path: Path, needed: list[str]) -> pl.DataFrame:
    """The ``needed`` columns of a parquet file (all of them when one is missing, so that the
    caller's error can list what the file has); a wide log is not read whole."""
    if not path.is_file():
        raise DataError(f"file {path} does not exist")
    # a .parquet.gz is read decompressed in memory, as every other .gz
    source: Path | io.BytesIO = path
    if path.name.endswith(".gz"):
        source = io.BytesIO(_read_bytes(path))
    try:
        names = pl.read_parquet_schema(source).keys()
        if isinstance(source, io.BytesIO):
            source.seek(0)
        return pl.read_parquet(source, columns=needed if set(needed) <= set(names) else None)
    except (OSError, pl.exceptions.PolarsError) as err:
        raise DataError(f"cannot read parquet file {path}: {err}") from None


def _load_delimited(path: Path, comma: bool) -> pl.DataFrame:
    """A csv or tsv file with RFC 4180 quoting; a tsv that does not parse so (a quote inside a
    value, as database exports write them) is read with quotes as ordinary characters. Blank
    lines are skipped."""
    separator = "," if comma else "\t"
    data = _read_bytes(path)
    try:
        df = _parse_delimited(data, separator, quoted=True)
    except pl.exceptions.PolarsError as err:
        unquoted = None if comma else _unquoted_tsv(data)
        if unquoted is None:
            raise _ragged_line(path, data, separator, strict=True) or DataError(
                f"cannot parse {path}: {str(err).splitlines()[0]}"
            ) from None
        df = unquoted
    if sum(df.null_count().row(0)):
        blank = pl.all_horizontal(pl.all().is_null() | (pl.all().str.strip_chars() == ""))
        blanks = int(df.select(blank.sum()).item())
        if blanks:
            logger.info("%s: skipped %d blank line(s)", path, blanks)
            df = df.filter(~blank)
    if sum(df.null_count().row(0)):  # Polars fills a short line with nulls: find it
        error = _ragged_line(path, data, separator, strict=False)
        if error is not None:
            raise error
    return df


def _parse_delimited(data: bytes, separator: str, quoted: bool) -> pl.DataFrame:
    return pl.read_csv(
        io.BytesIO(data),
        separator=separator,
        infer_schema=False,
        quote_char='"' if quoted else None,
    )


def _unquoted_tsv(data: bytes) -> pl.DataFrame | None:
    try:
        return _parse_delimited(data, "\t", quoted=False)
    except pl.exceptions.PolarsError:
        return None


def _ragged_line(path: Path, data: bytes, separator: str, strict: bool) -> DataError | None:
    """The first line whose field count differs from the header's, or where a quoted field
    that never closes begins (slow path, errors only). ``strict`` (for a file Polars could not
    parse) also finds a quote open at the end of the file, and quoting Polars refused."""
    text = io.StringIO(data.decode("utf-8", errors="replace"))
    csv.field_size_limit(max(csv.field_size_limit(), len(data) + 1))  # one field may be all
    reader = csv.reader(text, delimiter=separator, strict=strict)
    start = 1  # the line the next record begins on
    try:
        header = next(reader, [])
        start = reader.line_num + 1
        for row in reader:
            if any(field.strip() for field in row) and len(row) != len(header):
                if reader.line_num > start:  # a record over several lines: an open quote
                    return _unclosed_quote(path, start, reader.line_num)
                return DataError(
                    f"{path}:{reader.line_num}: malformed line; expected {len(header)} fields "
                    f"separated by {separator!r} like the header, found {len(row)}"
                )
            start = reader.line_num + 1
    except csv.Error as err:
        if "end of data" in str(err):
            return _unclosed_quote(path, start, None)  # it runs to the end of the file
        if reader.line_num > start:
            return _unclosed_quote(path, start, reader.line_num)
        return DataError(f"{path}:{reader.line_num}: malformed quoting ({err})")
    return None


def _unclosed_quote(path: Path, line: int, until: int | None) -> DataError:
    end = "the end of the file" if until is None else f"line {until}"
    return DataError(
        f"{path}:{line}: a quoted field opens on this line and runs on to {end}; close the "
        'quote, or double a quote that belongs to the value ("")'
    )


def _to_id(path: Path, values: pl.Series, column: str) -> pl.Series:
    _refuse_empty(path, values, column, "drop those rows or fill them in")
    if values.dtype.is_nested():  # a cast to String would raise, or print a struct as "{1}"
        raise _wrong_type(path, values, column, "ids")
    if values.dtype.is_float():  # pandas writes an integer column with gaps as floats
        values = _float_ids(path, values, column)
    try:
        ids = values.cast(pl.String)
    except pl.exceptions.PolarsError:
        raise _wrong_type(path, values, column, "ids") from None
    _warn_of_padded_ids(path, ids, column)
    return ids


def _float_ids(path: Path, values: pl.Series, column: str) -> pl.Series:
    """A float id column: NaN is a missing id, not an item "NaN"; whole numbers are the
    integers they hold ("10", not "10.0", as the same id reads from any other file)."""
    missing = values.is_nan()
    if missing.any():
        row = int(missing.arg_true()[0])
        raise DataError(
            f"{path}: column {column!r} is empty (NaN) in data row {row + 1}; drop those rows "
            "or fill them in"
        )
    whole = (values == values.floor()) & (values.abs() < 2.0**53)
    if whole.all():
        return values.cast(pl.Int64)
    return values


def _warn_of_padded_ids(path: Path, ids: pl.Series, column: str) -> None:
    """Ids are kept exactly as written, so 'u1 ' and 'u1' are two users: say so."""
    padded = ids.filter(ids != ids.str.strip_chars())
    if len(padded):
        logger.warning(
            "%s: %d ids in column %r have leading or trailing spaces (e.g. %r), kept as written: "
            "%r is another id than %r",
            path,
            len(padded),
            column,
            padded[0],
            padded[0],
            padded[0].strip(),
        )


def _to_epoch_seconds(path: Path, values: pl.Series, column: str) -> list[pl.Series]:
    """Integers (kept as they are), float seconds, ISO dates/date-times or temporal columns
    -> [whole seconds (Int64), precise time (Float64 seconds)]."""
    _refuse_empty(
        path,
        values,
        column,
        "drop or fill the rows without a timestamp, or set data.timestamp_column: null to keep "
        "the file order",
    )
    if values.dtype.is_temporal():
        try:
            micros = values.dt.epoch("us")
        except pl.exceptions.PolarsError:  # a time of day or a duration
            raise _wrong_type(path, values, column, "timestamps") from None
        seconds, precise = micros // 1_000_000, micros / 1_000_000
    elif values.dtype.is_numeric():
        seconds = values.cast(pl.Int64, strict=False)  # NaN, inf and overflow -> null
        precise = values.cast(pl.Float64)
    elif values.dtype == pl.String:
        seconds, precise = _parse_timestamps(values.str.strip_chars())  # "u1, i1, 5"
    else:
        raise _wrong_type(path, values, column, "timestamps")
    if seconds.null_count():
        row = int(seconds.is_null().arg_true()[0])
        raise DataError(
            f"{path}: column {column!r} has {values[row]!r} in data row {row + 1}, which is not "
            "a timestamp (expected epoch seconds or an ISO date-time)"
        )
    return [seconds.alias(TIMESTAMP), precise.alias(_PRECISE_TIMESTAMP)]


def _parse_timestamps(values: pl.Series) -> tuple[pl.Series, pl.Series]:
    """Strings, each integer seconds, else float seconds, else an ISO date-time -> (whole
    seconds, precise seconds); null where none fits."""
    integers = values.cast(pl.Int64, strict=False)
    floats = values.cast(pl.Float64, strict=False)
    floats = pl.select(pl.when(floats.is_finite()).then(floats)).to_series()  # not NaN, inf
    micros = pl.Series(values.name, [None] * len(values), dtype=pl.Int64)
    undated = integers.is_null() & floats.is_null()
    if undated.any():
        micros = micros.scatter(undated.arg_true(), _parse_datetimes(values.filter(undated)))
    seconds = pl.select(
        pl.coalesce(integers, floats.cast(pl.Int64, strict=False), micros // 1_000_000)
    ).to_series()
    precise = pl.select(
        pl.coalesce(integers.cast(pl.Float64), floats, micros / 1_000_000)
    ).to_series()
    return seconds, precise


def _parse_datetimes(values: pl.Series, formats: int = 8) -> pl.Series:
    """ISO dates / date-times -> epoch microseconds (naive ones as UTC); null where
    unparseable.

    Polars infers one format from a column's first value and leaves the values of any
    other null: the values left are parsed again, each time in the format of the first of
    them, so a log whose writers changed format (``Z``, an offset, a space) reads whole."""
    out = pl.Series(values.name, [None] * len(values), dtype=pl.Int64)
    # Only year-first dates: polars would read 02/01/2020 as 2 January (day first) without a
    # word, and a log written month first would be silently misordered.
    iso = values.str.contains(r"^\s*\d{4}[-/]\d{1,2}[-/]\d{1,2}").fill_null(False)
    for _ in range(formats):
        left = out.is_null() & iso
        if not left.any():
            break
        try:
            parsed = values.filter(left).str.to_datetime(strict=False).dt.epoch("us")
        except pl.exceptions.PolarsError:  # no format could be inferred from the first
            break
        if parsed.null_count() == len(parsed):
            break
        out = out.scatter(left.arg_true(), parsed)
    return out


def _to_float(path: Path, values: pl.Series, column: str) -> pl.Series:
    _refuse_empty(
        path,
        values,
        column,
        "drop or fill the rows without a rating, or set data.rating_column: null (and "
        "data.min_rating: null) to count every interaction",
    )
    if not (values.dtype.is_numeric() or values.dtype == pl.String):
        raise _wrong_type(path, values, column, "ratings")
    out = values.cast(pl.Float64, strict=False)
    bad = out.is_null() | out.is_nan()
    if bad.any():
        row = int(bad.arg_true()[0])
        raise DataError(
            f"{path}: column {column!r} has {values[row]!r} in data row {row + 1}, "
            "which is not a number"
        )
    return out.alias(RATING)


def _refuse_empty(path: Path, values: pl.Series, column: str, advice: str) -> None:
    if values.null_count():
        row = int(values.is_null().arg_true()[0])
        raise DataError(f"{path}: column {column!r} is empty in data row {row + 1}; {advice}")


def _wrong_type(path: Path, values: pl.Series, column: str, wanted: str) -> DataError:
    return DataError(
        f"{path}: column {column!r} holds {values.dtype} values, which cannot be {wanted}"
    )
