"""Item texts come from the item file that belongs to the interaction file, by original id."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from seqrec.config import DataConfig
from seqrec.data.item_text import (
    count_duplicates,
    count_missing,
    item_texts,
    read_items_tsv,
    read_u_item,
)
from seqrec.data.prepare import prepare
from seqrec.data.schema import DataError
from seqrec.data.sequences import PreparedData, Sequences
from seqrec.training.item_embeddings import fill_from_neighbours


def by_original(data: PreparedData, texts: list[str | None]) -> dict[str, str | None]:
    assert len(texts) == data.num_items + 1
    assert texts[0] is None
    return dict(zip(data.id_map.items, texts[1:], strict=True))


def test_hand_written_movies_dat(movielens: PreparedData) -> None:
    texts = by_original(movielens, item_texts(movielens))
    assert texts == {
        "1": "Toy Story (1995); genres: Animation, Children's, Comedy",
        "2": "Jumanji (1995); genres: Adventure, Children's, Fantasy",
        "3": "Heat (1995); genres: Action, Crime, Thriller",
        "4": "Sabrina (1995); genres: Comedy, Romance",
        "5": "Heat (1995); genres: Action, Crime, Thriller",
        "6": None,  # no line in movies.dat
        "7": "Café au lait (1993); genres: Comedy",  # Latin-1
    }
    listed = item_texts(movielens)
    assert count_missing(listed) == 1
    assert count_duplicates(listed) == 1


def test_item_file_in_the_data_dir_when_not_beside_the_source(
    movielens: PreparedData, movielens_dir: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "data" / movielens.name
    elsewhere.mkdir(parents=True)
    (movielens_dir / "movies.dat").rename(elsewhere / "movies.dat")
    assert count_missing(item_texts(movielens)) == movielens.num_items  # no file: all None
    assert count_missing(item_texts(movielens, tmp_path / "data")) == 1


def test_unknown_interaction_file_has_no_texts(movielens: PreparedData, tmp_path: Path) -> None:
    # bert4rec_beauty.txt lies beside Beauty_items.tsv but its ids are not those items.
    other = PreparedData(
        "amazon-beauty",
        str(tmp_path / "bert4rec_beauty.txt.gz"),
        movielens.sequences,
        None,
        movielens.id_map,
        movielens.split,
    )
    (tmp_path / "Beauty_items.tsv").write_text("item_id\tasin\ttitle\n1\tA\tlipstick\n")
    assert item_texts(other) == [None] * (movielens.num_items + 1)


def test_items_tsv_columns(tmp_path: Path) -> None:
    path = tmp_path / "Yelp_items.tsv.gz"
    rows = [
        "item_id\tbusiness_id\tname\tcategories",
        "1\tx1\tSal's Pizza\tPizza, Italian",
        "2\tx2\t\tBars",
        "3\tx3\t\t",
    ]
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write("\n".join(rows) + "\n")
    assert read_items_tsv(path) == {
        "1": "Sal's Pizza; categories: Pizza, Italian",
        "2": "categories: Bars",
    }
    ids_only = tmp_path / "Sports_and_Outdoors_items.tsv"
    ids_only.write_text("item_id\tasin\n1\tB0001\n")
    assert read_items_tsv(ids_only) == {}  # an ASIN is an id, not text
    bad = tmp_path / "bad.tsv"
    bad.write_text("item_id\tasin\ttitle\n1\tB0001\n")
    with pytest.raises(DataError, match=r"bad.tsv:2: expected 3 fields"):
        read_items_tsv(bad)


def test_u_item_genre_flags(tmp_path: Path) -> None:
    path = tmp_path / "u.item"
    flags = ["0"] * 19
    flags[1] = flags[5] = "1"  # Action, Comedy
    path.write_bytes(("7|Heat (1995)|01-Jan-1995||http://x|" + "|".join(flags) + "\n").encode())
    assert read_u_item(path) == {"7": "Heat (1995); genres: Action, Comedy"}


def test_fill_from_neighbours_uses_adjacent_training_items() -> None:
    # Items 1..4 (rows 0..3); item 2 and 4 have no text. Sequences: [1, 2, 3], [2, 1], [4].
    emb = np.array([[1.0, 0.0], [9.0, 9.0], [0.0, 1.0], [5.0, 5.0]], dtype=np.float32)
    has_text = np.array([True, False, True, False])
    train = Sequences.from_lists([[1, 2, 3], [2, 1], [4]])
    out = fill_from_neighbours(emb, has_text, train)
    # item 2 is next to 1 (twice) and 3: mean of (1,0), (1,0), (0,1); item 4 has no neighbour.
    np.testing.assert_allclose(out[1], [2 / 3, 1 / 3])
    np.testing.assert_array_equal(out[3], [0.0, 0.0])
    np.testing.assert_array_equal(out[[0, 2]], emb[[0, 2]])


def test_ml_1m_shared_data_titles_and_genres(shared_data: Path) -> None:
    data = prepare(DataConfig(dataset="ml-1m"), shared_data)
    texts = by_original(data, item_texts(data, shared_data))
    assert len(texts) == 3416
    assert texts["1"] == "Toy Story (1995); genres: Animation, Children's, Comedy"
    assert all(text for text in texts.values())  # every rated movie is in movies.dat
