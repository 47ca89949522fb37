"""Item text (titles, genres, categories) from the item file beside a dataset's interactions.

The item file is chosen by the *interaction file's* name, not the dataset's: a folder can
hold variants whose ids differ (``amazon-beauty/bert4rec_beauty.txt.gz`` does not share the
ids of ``Beauty_items.tsv``), and only a listed pair is known to agree. Files are looked
for beside the interaction file, then in ``<data_dir>/<dataset>/`` and
``$SEQREC_DATA_DIR/<dataset>/`` (a dataset downloaded into the cache has no item file there).
Gzipped and plain names are both accepted.
"""

from __future__ import annotations

import gzip
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from seqrec.data.datasets import DATA_DIR_ENV
from seqrec.data.schema import DataError
from seqrec.data.sequences import PreparedData

logger = logging.getLogger(__name__)

TextTable = dict[str, str]  # original item id -> text
Reader = Callable[[Path], TextTable]

# ML-100K's u.item ends in 19 genre flags; GroupLens' u.genre (not shipped) names them.
ML100K_GENRES = (
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
    "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery",
    "Romance", "Sci-Fi", "Thriller", "War", "Western",
)  # fmt: skip
# Columns of the derived *_items.tsv files that identify an item rather than describe it.
ID_COLUMNS = frozenset({"item_id", "asin", "business_id"})


def _lines(path: Path, encoding: str) -> Iterator[str]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding=encoding, newline="") as handle:
        for line in handle:
            line = line.rstrip("\r\n")
            if line.strip():
                yield line


def read_movielens_dat(path: Path) -> TextTable:
    """GroupLens ``movies.dat``: ``MovieID::Title::Genre|Genre`` (Latin-1) -> "title; genres"."""
    table: TextTable = {}
    for number, line in enumerate(_lines(path, "latin-1"), 1):
        parts = line.split("::")
        if len(parts) != 3:
            raise DataError(f"{path}:{number}: expected MovieID::Title::Genres, got {line!r}")
        movie, title, genres = (p.strip() for p in parts)
        table[movie] = _join(title, "genres", genres.split("|"))
    return table


def read_u_item(path: Path) -> TextTable:
    """ML-100K ``u.item``: ``id|title|date|video date|url|19 genre flags`` (Latin-1)."""
    table: TextTable = {}
    for number, line in enumerate(_lines(path, "latin-1"), 1):
        parts = line.split("|")
        if len(parts) != 5 + len(ML100K_GENRES):
            raise DataError(f"{path}:{number}: expected 24 '|'-separated fields, got {len(parts)}")
        genres = [g for g, flag in zip(ML100K_GENRES, parts[5:], strict=True) if flag == "1"]
        table[parts[0].strip()] = _join(parts[1].strip(), "genres", genres)
    return table


def read_items_tsv(path: Path) -> TextTable:
    """A derived ``*_items.tsv`` with a header: ``item_id``, id columns, then text columns.

    The first text column (title, name) leads; the others follow as ``column: value``.
    """
    lines = _lines(path, "utf-8")
    header = next(lines, "").split("\t")
    if not header or header[0] != "item_id":
        raise DataError(f"{path}: expected a header starting with item_id, got {header}")
    text_columns = [i for i, name in enumerate(header) if name not in ID_COLUMNS]
    table: TextTable = {}
    for number, line in enumerate(lines, 2):
        parts = line.split("\t")
        if len(parts) != len(header):
            raise DataError(f"{path}:{number}: expected {len(header)} fields, got {len(parts)}")
        if not text_columns:
            continue
        lead, *rest = (parts[i].strip() for i in text_columns)
        fields = [
            f"{header[i]}: {value}"
            for i, value in zip(text_columns[1:], rest, strict=True)
            if value
        ]
        text = "; ".join([lead, *fields] if lead else fields)
        if text:
            table[parts[0].strip()] = text
    return table


def _join(title: str, name: str, values: list[str]) -> str:
    values = [v for v in values if v]
    return f"{title}; {name}: {', '.join(values)}" if values else title


# interaction file (without .gz) -> its item file and reader
ITEM_FILES: dict[str, tuple[str, Reader]] = {
    "ratings.dat": ("movies.dat", read_movielens_dat),
    "ml-1m.sequences.txt": ("movies.dat", read_movielens_dat),
    "u.data": ("u.item", read_u_item),
    "Beauty.txt": ("Beauty_items.tsv", read_items_tsv),
    "Sports_and_Outdoors.txt": ("Sports_and_Outdoors_items.tsv", read_items_tsv),
    "Yelp.txt": ("Yelp_items.tsv.gz", read_items_tsv),
    "llamarec_games.sequences.txt": ("llamarec_games_items.tsv", read_items_tsv),
}


def find_item_file(
    data: PreparedData, data_dir: str | Path | None = None
) -> tuple[Path, Reader] | None:
    """The item file that belongs to ``data``'s interaction file, or None when none is known."""
    source = Path(data.source)
    known = ITEM_FILES.get(source.name.removesuffix(".gz"))
    if known is None:
        return None
    name, reader = known
    folders = [source.parent] if source.is_file() else []
    for root in (data_dir, os.environ.get(DATA_DIR_ENV)):
        if root:
            folders.append(Path(root).expanduser() / data.name)
    other = name.removesuffix(".gz") if name.endswith(".gz") else f"{name}.gz"
    for folder in folders:
        for candidate in (folder / name, folder / other):
            if candidate.is_file():
                return candidate, reader
    logger.warning(
        "no %s found for %s (looked in %s): items have no text",
        name,
        source.name,
        ", ".join(str(f) for f in folders) or "nowhere",
    )
    return None


def item_texts(data: PreparedData, data_dir: str | Path | None = None) -> list[str | None]:
    """(N + 1) texts indexed by internal item id; index 0 (padding) and items without text
    are None. All None for datasets without an item-text file (toys, lastfm, synthetic)."""
    texts: list[str | None] = [None] * (data.num_items + 1)
    found = find_item_file(data, data_dir)
    if found is None:
        return texts
    path, reader = found
    table = reader(path)
    for internal, original in enumerate(data.id_map.items, 1):
        texts[internal] = table.get(original)
    logger.info(
        "item texts from %s: %d of %d items",
        path,
        data.num_items - count_missing(texts),
        len(texts) - 1,
    )
    return texts


def count_missing(texts: list[str | None]) -> int:
    """Items 1..N without text."""
    return sum(text is None for text in texts[1:])


def count_duplicates(texts: list[str | None]) -> int:
    """Items 1..N whose text equals the text of an item listed before them."""
    counts = Counter(text for text in texts[1:] if text is not None)
    return sum(n - 1 for n in counts.values())
