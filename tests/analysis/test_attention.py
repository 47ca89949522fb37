"""Attention maps and the genre x genre matrix against brute-force loops; movies.dat reading."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from seqrec.analysis.attention import (
    GenreSelection,
    average_attention,
    find_movies_file,
    genre_attention,
    read_movie_genres,
    select_genre_items,
)
from seqrec.batch import PAD_ID
from seqrec.data.batches import left_padded
from seqrec.data.idmap import IdMap
from seqrec.models.sasrec import SASRec
from tests.analysis.test_diagnostics import eval_set

ROWS = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [10, 11, 12], [13], [2, 4, 6, 8, 10]]


def _weights(model: SASRec) -> tuple[torch.Tensor, list[torch.Tensor]]:
    histories = eval_set(ROWS).histories
    ids = torch.from_numpy(left_padded(histories, np.arange(len(ROWS)), model.config.max_seq_len))
    with torch.no_grad():
        _, weights = model.encode(ids, need_weights=True)
    return ids, [w.mean(dim=1) for w in weights]


def test_average_attention_by_brute_force(model: SASRec) -> None:
    recent = 4
    maps = average_attention(model, eval_set(ROWS), recent=recent, batch_size=2)
    ids, weights = _weights(model)
    L = ids.size(1)
    for layer, w in enumerate(weights):
        for a in range(recent):
            for b in range(recent):
                i, j = L - recent + a, L - recent + b
                cells = [
                    w[r, i, j].item()
                    for r in range(len(ROWS))
                    if ids[r, i] != PAD_ID and ids[r, j] != PAD_ID and j <= i
                ]
                expected = np.mean(cells) if cells else np.nan
                np.testing.assert_allclose(maps[layer][a, b], expected, rtol=1e-5, equal_nan=True)


def test_genre_attention_by_brute_force(model: SASRec) -> None:
    group = np.full(38, -1, dtype=np.int64)
    group[[1, 3, 5, 11, 13]] = 0
    group[[2, 4, 12]] = 1
    group[[6, 10]] = 2
    selection = GenreSelection(("A", "B", "C"), group, (5, 3, 2))
    means, pairs = genre_attention(model, eval_set(ROWS), selection, batch_size=3)
    ids, weights = _weights(model)
    for layer, w in enumerate(weights):
        total, count = np.zeros((3, 3)), np.zeros((3, 3), dtype=np.int64)
        for r in range(len(ROWS)):
            for i in range(ids.size(1)):
                for j in range(i):  # earlier keys only; the self pair is excluded
                    ga, gb = group[ids[r, i]], group[ids[r, j]]
                    if ids[r, i] != PAD_ID and ids[r, j] != PAD_ID and ga >= 0 and gb >= 0:
                        total[ga, gb] += w[r, i, j].item()
                        count[ga, gb] += 1
        np.testing.assert_array_equal(pairs[layer], count)
        expected = np.where(count > 0, total / np.maximum(count, 1), np.nan)
        np.testing.assert_allclose(means[layer], expected, rtol=1e-5, equal_nan=True)


def test_movies_dat_genres_and_disjoint_selection(tmp_path: Path) -> None:
    path = tmp_path / "movies.dat"
    lines = [
        "1::Alien (1979)::Horror|Sci-Fi",  # two wanted genres: left out
        "2::Toy Story (1995)::Animation|Children's|Comedy",
        "3::Brides (1999)::Romance",
        "4::Matrix (1999)::Action|Sci-Fi",
        "5::Hidden (2000)::Horror",
        "6::Not Rated (2000)::Drama",
    ]
    path.write_bytes("\n".join(lines).encode("latin-1"))
    genres = read_movie_genres(path)
    assert genres["2"] == ["Animation", "Children's", "Comedy"]
    id_map = IdMap(users=["u"], items=["4", "2", "3", "5", "1", "6", "99"])  # internal 1..7
    selection = select_genre_items(genres, id_map, per_genre=200)
    assert selection.genres == ("Sci-Fi", "Romance", "Animation", "Horror")
    assert selection.counts == (1, 1, 1, 1)
    np.testing.assert_array_equal(selection.group, [-1, 0, 2, 1, 3, -1, -1, -1])


def test_find_movies_file_explains_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "ml-1m").mkdir()
    found, note = find_movies_file("ml-1m", "", [tmp_path], None)
    assert found is None
    assert "movies.dat not found" in note
    (tmp_path / "ml-1m" / "movies.dat").write_text("1::X (1)::Horror\n")
    found, note = find_movies_file("ml-1m", "", [tmp_path], None)
    assert found == tmp_path / "ml-1m" / "movies.dat"
    found, note = find_movies_file("amazon-beauty", "", [tmp_path], None)
    assert found is None
    assert "for ML-1M" in note
    with pytest.raises(ValueError, match="MovieID::Title::Genres"):
        read_movie_genres(_empty(tmp_path))


def test_an_explicit_movies_file_must_be_a_movies_dat(tmp_path: Path) -> None:
    """Only the search beside the data may find nothing; a named file is used or refused."""
    good = tmp_path / "movies.dat"
    good.write_text("1::X (1)::Horror\n")
    assert find_movies_file("ml-1m", "", [], good) == (good, f"genres from {good}")
    # a file of one's own may hold MovieIDs; another registry dataset's ids are no movies
    assert find_movies_file("ratings.csv", "", [], good, from_file=True)[0] == good
    found, note = find_movies_file("synthetic", "", [], good)
    assert found == good
    assert "this run's items are synthetic's, not ML-1M movies: their ids are read as" in note
    for path, message in [
        (tmp_path / "nope.dat", "does not exist"),
        (tmp_path, "is a directory"),
        (_empty(tmp_path), "is not a MovieLens movies.dat"),
    ]:
        with pytest.raises(ValueError, match=re.escape(f"--movies {path} {message}")):
            find_movies_file("ml-1m", "", [tmp_path], path)


def _empty(tmp_path: Path) -> Path:
    path = tmp_path / "empty.dat"
    path.write_text("not a movies file\n")
    return path
