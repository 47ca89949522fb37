"""Semantic IDs: disambiguation, the usage/collision report, the artifact and its checks."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest

from seqrec.config import ConfigError, TokenizerConfig
from seqrec.data.schema import DataError
from seqrec.data.sequences import PreparedData
from seqrec.tokenizers.semantic_ids import (
    SemanticIds,
    disambiguate,
    format_report,
    make_semantic_ids,
    perplexity,
)
from seqrec.training.semantic_ids import fit_semantic_ids

# Five items, two levels: items 1, 3, 4 share (0, 1); items 2 and 5 are alone.
PATHS = np.array([[0, 1], [2, 0], [0, 1], [0, 1], [1, 1]])
IDS = ("a", "b", "c", "d", "e")


def test_disambiguate_counts_within_each_path_in_item_order() -> None:
    full = disambiguate(PATHS)
    assert full.shape == (5, 3)
    np.testing.assert_array_equal(full[:, :2], PATHS)
    assert full[:, 2].tolist() == [0, 0, 1, 2, 0]
    assert len({tuple(row) for row in full.tolist()}) == 5


def test_disambiguate_always_adds_the_level() -> None:
    unique = np.array([[0, 0], [0, 1], [1, 0]])
    assert disambiguate(unique)[:, 2].tolist() == [0, 0, 0]
    assert disambiguate(np.zeros((0, 2), dtype=np.int64)).shape == (0, 3)


@pytest.mark.parametrize("seed", range(3))
def test_disambiguated_paths_are_unique_on_random_codes(seed: int) -> None:
    codes = np.random.default_rng(seed).integers(0, 3, (500, 2))
    full = disambiguate(codes)
    assert len(np.unique(full, axis=0)) == 500
    for path in np.unique(codes, axis=0):
        rows = (codes == path).all(1)
        assert sorted(full[rows, 2].tolist()) == list(range(int(rows.sum())))


def test_report_on_a_hand_built_example() -> None:
    ids = make_semantic_ids(PATHS, 4, IDS, "rqkmeans", fit_seconds=1.5)
    assert ids.codes.shape == (6, 3)
    assert ids.codes[0].tolist() == [-1, -1, -1]
    assert ids.codebook_sizes == (4, 4, 4)
    report = ids.report()
    assert report["unique_paths"] == 3
    assert report["collision_rate"] == pytest.approx(3 / 5)  # items 1, 3, 4
    assert report["max_items_per_path"] == 3
    assert report["fit_seconds"] == 1.5
    level0, level1, extra = report["levels"]
    assert level0["used_codes"] == 3  # codes 0, 2, 1 with counts 3, 1, 1
    assert level0["perplexity"] == pytest.approx(
        math.exp(-(0.6 * math.log(0.6) + 2 * 0.2 * math.log(0.2)))
    )
    assert level1["used_codes"] == 2
    assert extra["used_codes"] == 3  # counters 0, 1, 2
    assert "collision rate 0.6000" in format_report(report)


def test_perplexity_of_uniform_and_single_code() -> None:
    assert perplexity(np.arange(8)) == pytest.approx(8.0)
    assert perplexity(np.zeros(5, dtype=np.int64)) == pytest.approx(1.0)


def test_disambiguation_overflow_warns_and_grows_the_last_vocabulary(
    caplog: pytest.LogCaptureFixture,
) -> None:
    codes = np.zeros((5, 2), dtype=np.int64)  # five items on one path, codebook of 3
    with caplog.at_level(logging.WARNING):
        ids = make_semantic_ids(codes, 3, IDS, "rqvae")
    assert "needs 5 codes" in caplog.text
    assert ids.codebook_sizes == (3, 3, 5)


def test_save_load_round_trip(tmp_path: Path) -> None:
    ids = make_semantic_ids(PATHS, 4, IDS, "rqvae", dataset="toy")
    ids.save(tmp_path)
    loaded = SemanticIds.load(tmp_path)
    np.testing.assert_array_equal(loaded.codes, ids.codes)
    assert (loaded.codebook_sizes, loaded.item_ids, loaded.method) == (
        ids.codebook_sizes,
        ids.item_ids,
        "rqvae",
    )
    assert loaded.info == {"dataset": "toy"}
    assert loaded.report() == ids.report()


def test_damaged_or_missing_artifact_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="holds no semantic IDs"):
        SemanticIds.load(tmp_path)
    make_semantic_ids(PATHS, 4, IDS, "rqvae").save(tmp_path)
    meta = json.loads((tmp_path / "semantic_ids.json").read_text())
    meta["codes_sha256"] = "0" * 64
    (tmp_path / "semantic_ids.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="damaged"):
        SemanticIds.load(tmp_path)


def test_invalid_codes_are_refused() -> None:
    codes = make_semantic_ids(PATHS, 4, IDS, "rqvae").codes
    with pytest.raises(ValueError, match="outside"):
        SemanticIds(codes, (2, 4, 4), IDS, "rqvae")
    with pytest.raises(ValueError, match="shape"):
        SemanticIds(codes, (4, 4, 4), IDS[:4], "rqvae")


def test_check_matches_names_the_difference() -> None:
    ids = make_semantic_ids(PATHS, 4, IDS, "rqvae")
    ids.check_matches(list(IDS))
    with pytest.raises(DataError, match="5 items in the semantic IDs, 4 in the data"):
        ids.check_matches(["a", "b", "c", "d"])
    with pytest.raises(
        DataError, match="internal item 2 is 'b' in the semantic IDs, 'x' in the data"
    ):
        ids.check_matches(["a", "x", "c", "d", "e"])


def test_codebook_larger_than_the_catalogue_is_an_error(movielens: PreparedData) -> None:
    with pytest.raises(ConfigError, match="codebook_size 256 is larger than the catalogue"):
        fit_semantic_ids(TokenizerConfig(method="rqkmeans"), movielens)
