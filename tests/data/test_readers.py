from __future__ import annotations

import gzip
import logging
from pathlib import Path

import polars as pl
import pytest

from seqrec.config import DataConfig, warn_once
from seqrec.data.prepare import prepare
from seqrec.data.preprocess import sort_by_time
from seqrec.data.readers import ColumnMap, detect_format, read_interactions
from seqrec.data.schema import DataError


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def rows(df: pl.DataFrame) -> list[tuple[object, ...]]:
    return list(df.iter_rows())


def test_sequences_one_row_per_item_in_file_order(tmp_path: Path) -> None:
    path = write(tmp_path / "seq.txt", "2 30 10 20\n1 10 30\n")
    df = read_interactions(path)
    assert df.columns == ["user_id", "item_id"]
    assert df.schema["user_id"] == pl.String
    assert df.schema["item_id"] == pl.String
    assert rows(df) == [("2", "30"), ("2", "10"), ("2", "20"), ("1", "10"), ("1", "30")]


def test_sequences_tolerate_tabs_runs_of_spaces_crlf_and_blank_lines(tmp_path: Path) -> None:
    path = write(tmp_path / "seq.txt", "\n2\t30  10 \r\n\n1 10 30\r\n\n")
    assert rows(read_interactions(path, "sequences")) == [
        ("2", "30"),
        ("2", "10"),
        ("1", "10"),
        ("1", "30"),
    ]


def test_gzip_is_read_transparently(tmp_path: Path) -> None:
    text = "1 5 6 7\n2 6 5\n"
    plain = read_interactions(write(tmp_path / "a.txt", text))
    packed = read_interactions(write(tmp_path / "b.txt.gz", text))
    assert plain.equals(packed)


def test_pairs_are_detected_and_read(tmp_path: Path) -> None:
    path = write(tmp_path / "Video.txt.gz", "1 5\n1 6\n2 5\n")
    assert detect_format(path) == "pairs"
    assert rows(read_interactions(path)) == [("1", "5"), ("1", "6"), ("2", "5")]


def test_txt_with_longer_lines_is_sequences(tmp_path: Path) -> None:
    assert detect_format(write(tmp_path / "x.txt", "1 5\n2 5 6\n")) == "sequences"


def test_movielens_ratings_dat(tmp_path: Path) -> None:
    path = write(tmp_path / "ratings.dat", "1::1193::5::978300760\n1::661::3::978302109\n")
    df = read_interactions(path)
    assert df.schema == pl.Schema(
        {"user_id": pl.String, "item_id": pl.String, "timestamp": pl.Int64, "rating": pl.Float64}
    )
    assert rows(df) == [("1", "1193", 978300760, 5.0), ("1", "661", 978302109, 3.0)]


def test_movielens_ratings_dat_is_read_as_latin_1(tmp_path: Path) -> None:
    # ML-1M's ratings.dat is Latin-1: byte 0xE9 is "é" there and an invalid byte in UTF-8.
    path = tmp_path / "ratings.dat"
    path.write_bytes(b"u\xe9::caf\xe9::4::978300760\n2::7::5::978300761\n")
    df = read_interactions(path)
    assert rows(df) == [("ué", "café", 978300760, 4.0), ("2", "7", 978300761, 5.0)]


def test_movielens_u_data_is_tab_separated(tmp_path: Path) -> None:
    path = write(tmp_path / "u.data.gz", "196\t242\t3\t881250949\n186\t302\t3\t891717742\n")
    assert detect_format(path) == "movielens"
    assert rows(read_interactions(path)) == [
        ("196", "242", 881250949, 3.0),
        ("186", "302", 891717742, 3.0),
    ]


def test_malformed_pair_line_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.txt", "1 5\n1 6\n\n2 5 7 8 9 1 1\n2 5 7\n")
    with pytest.raises(
        DataError, match=r"bad\.txt:4: malformed line '2 5 7 8 9 1 1'; expected `us"
    ):
        read_interactions(path, "pairs")


def test_sequence_line_without_items_is_malformed(tmp_path: Path) -> None:
    path = write(tmp_path / "seq.txt", "1 5 6\n2\n")
    with pytest.raises(DataError, match=r"seq\.txt:2: malformed line '2'; expected `user item"):
        read_interactions(path, "sequences")


def test_movielens_bad_timestamp_names_line(tmp_path: Path) -> None:
    path = write(tmp_path / "ratings.dat", "1::2::5::100\n1::3::4::soon\n")
    with pytest.raises(DataError, match=r"ratings\.dat:2: malformed line.*integer timestamp"):
        read_interactions(path)


def test_movielens_wrong_field_count_names_line(tmp_path: Path) -> None:
    path = write(tmp_path / "ratings.dat", "1::2::5::100\n1::3::4\n")
    with pytest.raises(DataError, match=r"ratings\.dat:2: malformed line '1::3::4'.*4 fields"):
        read_interactions(path)


CSV = "uid,iid,when,stars\nu1,i1,2020-01-01T00:00:00,4.5\nu1,i2,2020-01-02T00:00:00,3\n"


def test_csv_with_column_mapping_and_iso_timestamps(tmp_path: Path) -> None:
    path = write(tmp_path / "log.csv", CSV)
    df = read_interactions(path, "auto", ColumnMap("uid", "iid", "when", "stars"))
    assert rows(df) == [("u1", "i1", 1577836800, 4.5), ("u1", "i2", 1577923200, 3.0)]


def test_tsv_and_parquet_read_like_csv(tmp_path: Path) -> None:
    columns = ColumnMap("uid", "iid", "ts")
    tsv = write(tmp_path / "log.tsv.gz", "uid\tiid\tts\n7\t8\t100\n7\t9\t99\n")
    from_tsv = read_interactions(tsv, "auto", columns)
    frame = pl.DataFrame({"uid": [7, 7], "iid": [8, 9], "ts": [100, 99]})
    frame.write_parquet(tmp_path / "log.parquet")
    from_parquet = read_interactions(tmp_path / "log.parquet", "auto", columns)
    assert rows(from_tsv) == rows(from_parquet) == [("7", "8", 100), ("7", "9", 99)]


def test_wrong_column_name_lists_the_file_columns(tmp_path: Path) -> None:
    path = write(tmp_path / "log.csv", CSV)
    with pytest.raises(DataError, match=r"no column\(s\) 'user_id'.*has columns 'uid', 'iid'"):
        read_interactions(path, "csv", ColumnMap(item="iid"))


def test_csv_ragged_line_names_line(tmp_path: Path) -> None:
    too_many = write(tmp_path / "a.csv", "user_id,item_id\n1,2\n1,3,9\n")
    with pytest.raises(DataError, match=r"a\.csv:3: malformed line; expected 2 fields"):
        read_interactions(too_many)
    too_few = write(tmp_path / "b.csv", "user_id,item_id\n1,2\n1\n")
    with pytest.raises(DataError, match=r"b\.csv:3: malformed line; expected 2 fields"):
        read_interactions(too_few)


def test_a_quote_that_never_closes_is_named_where_it_opens(tmp_path: Path) -> None:
    body = "".join(f"u{i},i{i}\n" for i in range(40))
    to_the_end = write(tmp_path / "a.csv", f'user_id,item_id\nu0,i0\nu1,"i1\n{body}')
    with pytest.raises(
        DataError, match=r"a\.csv:3: a quoted field opens on this line and runs on to the end"
    ):
        read_interactions(to_the_end)
    # another stray quote later closes it: the field swallows the lines between
    closed_later = write(tmp_path / "b.csv", f'user_id,item_id\nu1,"i1\n{body}u2,i2"x\nu3,i3\n')
    with pytest.raises(
        DataError, match=r"b\.csv:2: a quoted field opens on this line and runs on to line 43"
    ):
        read_interactions(closed_later)


def test_quoted_csv_fields_keep_their_commas_and_doubled_quotes(tmp_path: Path) -> None:
    path = write(tmp_path / "a.csv", 'user_id,item_id\nu1,"Book, vol. 2"\nu1,"12"" pizza"\n')
    assert rows(read_interactions(path)) == [("u1", "Book, vol. 2"), ("u1", '12" pizza')]


def test_a_quoted_tsv_reads_like_a_quoted_csv(tmp_path: Path) -> None:
    """What Python's csv and pandas write with sep="\\t": a field quoted when it holds a
    tab or a quote; here the header too."""
    text = '"user_id"\t"item_id"\tts\nu1\t"a\tb"\t"1"\nu1\t"12"" pizza"\t2\n'
    df = read_interactions(write(tmp_path / "a.tsv", text), "auto", ColumnMap(timestamp="ts"))
    assert rows(df) == [("u1", "a\tb", 1), ("u1", '12" pizza', 2)]


def test_a_whitespace_line_beside_an_empty_optional_field_is_skipped(tmp_path: Path) -> None:
    text = "user_id,item_id,ts,stars\nu1,i1,1,\n   \nu1,i2,2,5\n"
    df = read_interactions(write(tmp_path / "a.csv", text), "csv", ColumnMap(timestamp="ts"))
    assert rows(df) == [("u1", "i1", 1), ("u1", "i2", 2)]


def test_a_tsv_quote_is_part_of_the_value(tmp_path: Path) -> None:
    path = write(tmp_path / "a.tsv", 'user_id\titem_id\nu1\t12" pizza\nu1\t"quoted" name\nu2\tx\n')
    assert rows(read_interactions(path)) == [
        ("u1", '12" pizza'),
        ("u1", '"quoted" name'),
        ("u2", "x"),
    ]


@pytest.mark.parametrize("name", ["a.csv", "a.tsv"])
def test_blank_lines_of_a_table_are_skipped(tmp_path: Path, name: str) -> None:
    sep = "," if name.endswith(".csv") else "\t"
    path = write(tmp_path / name, f"user_id{sep}item_id\nu1{sep}i1\n\nu1{sep}i2\n \n\n")
    assert rows(read_interactions(path)) == [("u1", "i1"), ("u1", "i2")]
    half = write(tmp_path / f"half-{name}", f"user_id{sep}item_id\nu1{sep}i1\nu2{sep}\n")
    with pytest.raises(DataError, match=r"column 'item_id' is empty in data row 2"):
        read_interactions(half)


def test_timestamps_in_several_iso_formats_are_read_alike(tmp_path: Path) -> None:
    """Writers that changed format within one log: Z, no zone (UTC), an offset, a space."""
    values = [
        "2023-11-14T22:17:05Z",
        "2023-11-14 22:17:05",
        "2023-11-15T00:17:05+02:00",
        "2023-11-14T22:17:05",
        "2023-11-14T22:17:05.250Z",
    ]
    text = "user_id,item_id,ts\n" + "".join(f"u1,i{n},{v}\n" for n, v in enumerate(values))
    df = read_interactions(write(tmp_path / "a.csv", text), "csv", ColumnMap(timestamp="ts"))
    assert df["timestamp"].to_list() == [1700000225] * len(values)


def test_a_guessed_format_that_does_not_fit_says_how_to_set_one(tmp_path: Path) -> None:
    path = write(tmp_path / "log.txt", "user,item,ts\nu1,i1,1\n")
    with pytest.raises(
        DataError, match=r"read as sequences, guessed from the file name.*data\.format"
    ):
        read_interactions(path)
    with pytest.raises(DataError, match=r"malformed line") as given:
        read_interactions(path, "sequences")
    assert "(read as" not in str(given.value)


def test_bad_timestamp_value_is_reported(tmp_path: Path) -> None:
    path = write(tmp_path / "a.csv", "user_id,item_id,ts\n1,2,100\n1,3,yesterday\n")
    with pytest.raises(DataError, match=r"'yesterday' in data row 2, which is not a timestamp"):
        read_interactions(path, "csv", ColumnMap(timestamp="ts"))


@pytest.mark.parametrize("name", ["empty.txt", "empty.csv", "empty.txt.gz", "ratings.dat"])
def test_empty_file(tmp_path: Path, name: str) -> None:
    path = write(tmp_path / name, "  \n\n")
    with pytest.raises(DataError, match=r"is empty"):
        read_interactions(path, "sequences" if name.endswith(".txt") else "auto")


def test_header_only_csv(tmp_path: Path) -> None:
    path = write(tmp_path / "a.csv", "user_id,item_id\n")
    with pytest.raises(DataError, match=r"has a header but no rows"):
        read_interactions(path)


@pytest.mark.parametrize("name", ["nope.txt", "nope.csv", "nope.parquet", "u.data"])
def test_missing_file(tmp_path: Path, name: str) -> None:
    with pytest.raises(DataError, match=r"does not exist"):
        read_interactions(tmp_path / name, "sequences" if name.endswith(".txt") else "auto")


def test_unknown_extension_asks_for_a_format(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"set data.format to one of csv, tsv, parquet"):
        read_interactions(write(tmp_path / "log.json", "{}"))


def test_corrupt_gzip_is_a_data_error(tmp_path: Path) -> None:
    path = tmp_path / "seq.txt.gz"
    path.write_bytes(gzip.compress(b"1 2 3\n")[:-6])
    with pytest.raises(DataError, match=r"cannot read .*seq\.txt\.gz"):
        read_interactions(path, "sequences")


def shard_log(folder: Path) -> pl.DataFrame:
    """A log of 6 rows written as 3 parquet shards (one in a sub-directory), plus the files
    Spark writes beside them; returns the whole log in shard order."""
    log = pl.DataFrame(
        {
            "uid": [1, 1, 2, 2, 3, 3],
            "iid": [5, 6, 5, 7, 6, 7],
            "ts": [10, 11, 12, 13, 14, 15],
            "wide": ["unused"] * 6,  # a column no reader needs
        }
    )
    (folder / "day=2").mkdir(parents=True)
    log[0:2].write_parquet(folder / "part-0.parquet")
    log[2:4].write_parquet(folder / "part-1.parquet")
    log[4:6].write_parquet(folder / "day=2" / "part-0.parquet")
    (folder / "_SUCCESS").write_text("")
    (folder / ".part-0.parquet.crc").write_text("not a shard")
    return log


def test_a_directory_is_read_as_its_shards_in_path_order(tmp_path: Path) -> None:
    log = shard_log(tmp_path / "log")
    df = read_interactions(tmp_path / "log", "auto", ColumnMap("uid", "iid", "ts"))
    expected = [(str(u), str(i), t) for u, i, t in log.select("uid", "iid", "ts").iter_rows()]
    # day=2/part-0 sorts before part-0: paths are compared part by part
    assert rows(df) == expected[4:6] + expected[0:4]
    assert df.columns == ["user_id", "item_id", "timestamp"]


def test_a_directory_without_shards_or_with_mixed_formats_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "_SUCCESS").write_text("")
    with pytest.raises(DataError, match=r"empty holds no interaction file"):
        read_interactions(tmp_path / "empty")
    shard_log(tmp_path / "mixed")
    write(tmp_path / "mixed" / "extra.csv", "uid,iid,ts\n1,2,3\n")
    with pytest.raises(DataError, match=r"different formats \(day=2/part-0.parquet: parquet, "):
        read_interactions(tmp_path / "mixed", "auto", ColumnMap("uid", "iid", "ts"))


def test_a_shard_without_a_column_is_named(tmp_path: Path) -> None:
    shard_log(tmp_path / "log")
    pl.DataFrame({"uid": [9], "item": [9], "ts": [20]}).write_parquet(
        tmp_path / "log" / "z.parquet"
    )
    with pytest.raises(DataError, match=r"z\.parquet: no column\(s\) 'iid'"):
        read_interactions(tmp_path / "log", "auto", ColumnMap("uid", "iid", "ts"))


def test_empty_shards_are_skipped_and_a_log_of_only_empty_shards_is_refused(
    tmp_path: Path,
) -> None:
    log = shard_log(tmp_path / "log")
    log.clear().write_parquet(tmp_path / "log" / "part-2.parquet")  # an empty partition
    (tmp_path / "log" / "part-3.parquet").write_bytes(b"")
    df = read_interactions(tmp_path / "log", "auto", ColumnMap("uid", "iid", "ts"))
    assert df.height == log.height
    write(tmp_path / "days" / "day-1.csv", "uid,iid\n")  # a day without interactions
    write(tmp_path / "days" / "day-2.csv", "uid,iid\n1,2\n")
    assert rows(read_interactions(tmp_path / "days", "auto", ColumnMap("uid", "iid"))) == [
        ("1", "2")
    ]
    (tmp_path / "days" / "day-2.csv").write_text("uid,iid\n")
    with pytest.raises(DataError, match=r"every shard of .*days is empty"):
        read_interactions(tmp_path / "days", "auto", ColumnMap("uid", "iid"))


def test_txt_shards_sniffed_as_pairs_and_sequences_are_read_as_sequences(tmp_path: Path) -> None:
    write(tmp_path / "log" / "part-0.txt", "u1 a b c\nu2 b c\n")
    write(tmp_path / "log" / "part-1.txt", "u3 a\nu4 c\n")  # one item a line: sniffs as pairs
    df = read_interactions(tmp_path / "log")
    assert [(u, i) for u, i in df.select("user_id", "item_id").iter_rows()] == [
        ("u1", "a"),
        ("u1", "b"),
        ("u1", "c"),
        ("u2", "b"),
        ("u2", "c"),
        ("u3", "a"),
        ("u4", "c"),
    ]


def test_a_user_in_two_sequences_shards_is_refused(tmp_path: Path) -> None:
    write(tmp_path / "log" / "part-0.txt", "u1 a b c\nu2 b c\n")
    write(tmp_path / "log" / "part-1.txt", "u3 a b\nu2 c a\n")
    with pytest.raises(
        DataError, match=r"user 'u2' is in two shards of .*log \(part-0\.txt and part-1\.txt\)"
    ):
        read_interactions(tmp_path / "log")
    write(tmp_path / "pairs" / "part-0.txt", "u1 a\nu2 b\n")  # pairs: a user on many lines
    write(tmp_path / "pairs" / "part-1.txt", "u1 b\nu2 c\n")
    assert read_interactions(tmp_path / "pairs").height == 4


def test_a_sniffed_user_item_timestamp_log_is_refused_as_sequences(tmp_path: Path) -> None:
    """One interaction per line with a timestamp has 3 tokens, so it sniffs as sequences:
    the timestamps would become items and each user's lines would be glued together."""
    text = "Zoë SKU_21 1700556467\nLiu SKU_3 1700556470\nZoë SKU_8 1700556499\n"
    path = write(tmp_path / "log.txt", text)
    assert detect_format(path) == "sequences"
    with pytest.raises(
        DataError,
        match=r"log\.txt: user 'Zoë' is on lines 1 and 3, but a sequences file .* holds one "
        r"line per user; .*one interaction per line.*csv",
    ):
        read_interactions(path)


def test_pairs_given_as_sequences_are_refused_with_the_pairs_format_named(tmp_path: Path) -> None:
    path = write(tmp_path / "log.txt", "u1 a\nu2 b\n\nu2 c\n")
    with pytest.raises(DataError, match=r"user 'u2' is on lines 2 and 4.*data\.format: pairs"):
        read_interactions(path, "sequences")


def rising_within_a_second(values: list[str]) -> str:
    """A csv of one user's items A..H at ``values`` (oldest first), written newest first."""
    letters = "ABCDEFGH"[: len(values)]
    lines = [f"u0,{item},{value}\n" for item, value in zip(letters, values, strict=True)]
    return "user,item,ts\n" + "".join(reversed(lines))


FRACTIONAL_TIMES = {
    "iso": [f"2023-11-14T22:13:20.{tenth}00Z" for tenth in range(8)],
    "float seconds": [f"1700000000.{tenth}" for tenth in range(8)],
    "integer milliseconds": [str(1700000000000 + 100 * tenth) for tenth in range(8)],
}


@pytest.mark.parametrize("kind", list(FRACTIONAL_TIMES))
def test_events_within_one_second_keep_their_time_order(tmp_path: Path, kind: str) -> None:
    path = write(tmp_path / "log.csv", rising_within_a_second(FRACTIONAL_TIMES[kind]))
    config = DataConfig(
        dataset="file",
        path=str(path),
        user_column="user",
        item_column="item",
        timestamp_column="ts",
        min_user_interactions=1,
        min_item_interactions=1,
    )
    prepared = prepare(config, use_cache=False)
    assert prepared.id_map.item_to_original(prepared.sequences[0]) == list("ABCDEFGH")


def test_fractional_timestamps_order_rows_across_shards(tmp_path: Path) -> None:
    """Shards partitioned by something other than time: the precise time orders them."""
    write(tmp_path / "log" / "a.csv", "user,item,ts\nu0,late,100.9\nu1,x,50\n")
    write(tmp_path / "log" / "b.csv", "user,item,ts\nu0,early,100.2\nu0,first,99\n")
    df = sort_by_time(read_interactions(tmp_path / "log", "csv", ColumnMap("user", "item", "ts")))
    assert rows(df.filter(pl.col("user_id") == "u0")) == [
        ("u0", "first", 99),
        ("u0", "early", 100),
        ("u0", "late", 100),
    ]


def test_integer_timestamps_keep_the_file_order(tmp_path: Path) -> None:
    path = write(tmp_path / "a.csv", "user_id,item_id,ts\nu1,a,9\nu2,b,1\nu1,c,9\n")
    df = read_interactions(path, "csv", ColumnMap(timestamp="ts"))
    assert rows(df) == [("u1", "a", 9), ("u2", "b", 1), ("u1", "c", 9)]


def test_dates_that_are_not_year_first_are_refused_not_guessed(tmp_path: Path) -> None:
    """Polars guessed day-first for 02/01/2020 and 03/04/2020, silently reordering a log that
    was written month-first."""
    path = write(tmp_path / "a.csv", "user_id,item_id,ts\nu1,a,02/01/2020\nu1,b,03/04/2020\n")
    with pytest.raises(DataError, match=r"'02/01/2020' in data row 1, which is not a timestamp"):
        read_interactions(path, "csv", ColumnMap(timestamp="ts"))


@pytest.mark.parametrize("value", ["NaN", "inf", "1e30", "02/01/2020", "2 Jan 2020"])
def test_a_csv_timestamp_that_is_no_time_names_file_column_and_row(
    tmp_path: Path, value: str
) -> None:
    path = write(tmp_path / "a.csv", f"user_id,item_id,ts\n1,2,100\n1,3,{value}\n")
    with pytest.raises(
        DataError, match=rf"a\.csv: column 'ts' has '{value}' in data row 2, which is not a time"
    ):
        read_interactions(path, "csv", ColumnMap(timestamp="ts"))


@pytest.mark.parametrize(
    ("column", "values", "pattern"),
    [
        ("iid", [[1, 2], [3]], r"column 'iid' holds List\(Int64\) values, which cannot be ids"),
        ("iid", [{"a": 1}, {"a": 2}], r"column 'iid' holds Struct.* values, which cannot be ids"),
        ("ts", [[1], [2]], r"column 'ts' holds List\(Int64\) values, which cannot be timestamps"),
        ("ts", [True, False], r"column 'ts' holds Boolean values, which cannot be timestamps"),
        ("r", [[1.0], [2.0]], r"column 'r' holds List\(Float64\) values, which cannot be ratings"),
    ],
)
def test_a_parquet_column_of_the_wrong_type_is_named(
    tmp_path: Path, column: str, values: list[object], pattern: str
) -> None:
    frame = pl.DataFrame({"uid": [1, 1], "iid": [5, 6], "ts": [1, 2], "r": [4.0, 5.0]})
    frame.with_columns(pl.Series(column, values)).write_parquet(tmp_path / "log.parquet")
    with pytest.raises(DataError, match=rf"log\.parquet: {pattern}"):
        read_interactions(tmp_path / "log.parquet", "auto", ColumnMap("uid", "iid", "ts", "r"))


def test_a_parquet_nan_timestamp_or_rating_names_its_row(tmp_path: Path) -> None:
    frame = pl.DataFrame({"uid": [1, 1], "iid": [5, 6], "ts": [1.0, 2.0], "r": [4.0, 5.0]})
    nan = float("nan")
    frame.with_columns(ts=pl.Series([1.0, nan])).write_parquet(tmp_path / "t.parquet")
    frame.with_columns(r=pl.Series([nan, 5.0])).write_parquet(tmp_path / "r.parquet")
    columns = ColumnMap("uid", "iid", "ts", "r")
    with pytest.raises(DataError, match=r"column 'ts' has nan in data row 2, which is not a"):
        read_interactions(tmp_path / "t.parquet", "auto", columns)
    with pytest.raises(DataError, match=r"column 'r' has nan in data row 1, which is not a nu"):
        read_interactions(tmp_path / "r.parquet", "auto", columns)


def test_an_empty_timestamp_or_rating_says_what_to_do(tmp_path: Path) -> None:
    path = write(tmp_path / "a.csv", "user_id,item_id,ts,r\nu1,a,1,5\nu1,b,,\n")
    with pytest.raises(
        DataError,
        match=r"column 'ts' is empty in data row 2; drop or fill the rows without a timestamp, "
        r"or set data\.timestamp_column: null",
    ):
        read_interactions(path, "csv", ColumnMap(timestamp="ts"))
    with pytest.raises(
        DataError,
        match=r"column 'r' is empty in data row 2; drop or fill the rows without a rating, "
        r"or set data\.rating_column: null",
    ):
        read_interactions(path, "csv", ColumnMap(rating="r"))


def test_a_headerless_csv_is_told_to_add_a_header(tmp_path: Path) -> None:
    path = write(tmp_path / "a.csv", "user_77,SKU 0,1700282575,2\nuser_77,SKU 1,1700282599,4\n")
    with pytest.raises(DataError) as raised:
        read_interactions(path)
    message = str(raised.value)
    assert "has columns 'user_77', 'SKU 0', '1700282575', '2'" in message
    assert "the first line looks like data: the file needs a header row naming its columns" in (
        message
    )
    assert "set data.user_column" not in message  # that advice would drop the first row
    assert "\n" not in message


def test_a_header_of_non_numbers_that_repeats_as_data_looks_like_data(tmp_path: Path) -> None:
    path = write(tmp_path / "a.csv", "alice,apple\nbob,pear\nalice,plum\n")
    with pytest.raises(DataError, match=r"the first line looks like data"):
        read_interactions(path)
    named = write(tmp_path / "b.csv", "who,what,2024\nalice,apple,1\nbob,pear,2\n")
    with pytest.raises(DataError, match=r"set data.user_column") as raised:
        read_interactions(named)  # a column named 2024 does not make the header data
    assert "looks like data" not in str(raised.value)


@pytest.mark.parametrize(
    ("name", "separator", "shown"),
    [("a.csv", ";", "';'"), ("a.csv", "|", "'|'"), ("a.csv", "\t", "a tab"), ("a.tsv", ",", "','")],
)
def test_a_table_with_another_delimiter_is_told_so(
    tmp_path: Path, name: str, separator: str, shown: str
) -> None:
    path = write(tmp_path / name, f"user_id{separator}item_id\nu1{separator}i1\n")
    with pytest.raises(
        DataError,
        match=rf"the file's delimiter may be {shown}: csv files are comma-separated, tsv files "
        r"tab-separated$",
    ):
        read_interactions(path)


def test_ids_with_surrounding_spaces_are_kept_and_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path / "log.csv", 'user_id,item_id\nu1,a\n"u1 ",b\nu2,a\n')
    with caplog.at_level(logging.WARNING):
        df = read_interactions(path)
    assert df["user_id"].to_list() == ["u1", "u1 ", "u2"]
    assert "1 ids in column 'user_id' have leading or trailing spaces (e.g. 'u1 ')" in caplog.text
    caplog.clear()
    read_interactions(write(tmp_path / "clean.csv", "user_id,item_id\nu1,a\nu2,b\n"))
    assert "spaces" not in caplog.text


@pytest.mark.parametrize(
    ("text", "fmt"),
    [("user_id item_id\nu1 a\nu1 b\n", "pairs"), ("user items\nu1 a b\nu2 b\n", "sequences")],
)
def test_a_header_line_of_a_whitespace_file_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str, fmt: str
) -> None:
    path = write(tmp_path / "log.txt", text)
    with caplog.at_level(logging.WARNING):
        df = read_interactions(path, fmt)  # type: ignore[arg-type]
    assert "user" not in df["user_id"].to_list()
    assert df.height == 2 if fmt == "pairs" else df.height == 3
    assert "skipped its first line" in caplog.text
    users = read_interactions(write(tmp_path / "ids.txt", "user item\n"), "pairs")["user_id"]
    assert users.to_list() == []  # only a header: no rows, not a user named "user"


def test_a_time_column_that_is_not_read_is_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The rows then keep the file order (here: newest first), silently, as they once did."""
    text = "user_id,item_id,Timestamp\nu1,b,200\nu1,a,100\n"
    path = write(tmp_path / "log.csv", text)
    warn_once.cache_clear()
    with caplog.at_level(logging.WARNING):
        assert read_interactions(path)["item_id"].to_list() == ["b", "a"]
    assert (
        "the table has a column 'Timestamp' but data.timestamp_column is not set: each user's "
        "rows keep the file order; set data.timestamp_column: Timestamp to order them by time"
    ) in caplog.text
    caplog.clear()
    read_interactions(path, "auto", ColumnMap(timestamp="Timestamp"))
    read_interactions(write(tmp_path / "plain.csv", "user_id,item_id,score\nu1,a,1\n"))
    assert caplog.text == ""


def test_float_id_columns_read_as_the_integers_they_hold_and_nan_is_missing(
    tmp_path: Path,
) -> None:
    """pandas writes an integer column with gaps as floats: ids were "10.0", and every NaN
    one shared item "NaN"."""
    path = tmp_path / "log.parquet"
    pl.DataFrame({"user_id": [1.0, 1.0, 2.0], "item_id": [10.0, 11.0, 10.0]}).write_parquet(path)
    assert rows(read_interactions(path)) == [("1", "10"), ("1", "11"), ("2", "10")]
    pl.DataFrame({"user_id": [1, 1], "item_id": [10.0, float("nan")]}).write_parquet(path)
    with pytest.raises(DataError, match=r"column 'item_id' is empty \(NaN\) in data row 2"):
        read_interactions(path)
    pl.DataFrame({"user_id": [1, 1], "item_id": [1.5, 2.0]}).write_parquet(path)
    assert read_interactions(path)["item_id"].to_list() == ["1.5", "2.0"]  # not whole: as is


@pytest.mark.parametrize(
    ("name", "fmt", "text", "users"),
    [
        ("log.txt", "pairs", "1 10\n1 11\n", ["1", "1"]),
        ("log.txt", "sequences", "1 10 11\n2 10\n", ["1", "1", "2"]),
        ("ratings.dat", "auto", "1::10::5::100\n1::11::4::101\n", ["1", "1"]),
    ],
    ids=["pairs", "sequences", "ratings-dat"],
)
def test_a_byte_order_mark_is_not_part_of_the_first_id(
    tmp_path: Path, name: str, fmt: str, text: str, users: list[str]
) -> None:
    """It split user 1 of ratings.dat into 'ï»¿1' and '1' (read as Latin-1)."""
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert read_interactions(path, fmt)["user_id"].to_list() == users  # type: ignore[arg-type]


def test_a_gzipped_parquet_file_is_read(tmp_path: Path) -> None:
    plain = tmp_path / "log.parquet"
    pl.DataFrame({"user_id": ["u1", "u1"], "item_id": ["a", "b"]}).write_parquet(plain)
    packed = tmp_path / "log.parquet.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert rows(read_interactions(packed)) == rows(read_interactions(plain))


def test_spaces_around_a_timestamp_are_not_part_of_it(tmp_path: Path) -> None:
    path = write(tmp_path / "log.csv", "user_id,item_id,ts\nu1,i1, 5\nu1,i2,3 \n")
    df = read_interactions(path, "auto", ColumnMap(timestamp="ts"))
    assert df["timestamp"].to_list() == [5, 3]


def test_a_header_that_names_a_read_column_twice_is_refused(tmp_path: Path) -> None:
    """The first one was read without a word."""
    path = write(tmp_path / "log.csv", "user_id,item_id,item_id\nu1,a,b\nu1,c,d\n")
    with pytest.raises(DataError, match="the header names column 'item_id' more than once"):
        read_interactions(path)
    other = write(tmp_path / "other.csv", "user_id,item_id,note,note\nu1,a,x,y\n")
    assert rows(read_interactions(other)) == [("u1", "a")]  # a column not read may repeat
