"""TIGER and TrieRec through ``seqrec train`` / ``evaluate`` / ``recommend``: semantic IDs
fitted into the run, reused by another run, checked against the data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from seqrec.cli import main
from seqrec.tokenizers import SemanticIds
from seqrec.training.checkpoint import load_run
from seqrec.training.semantic_ids import SEMANTIC_IDS
from tests.cli.helpers import tiger_raw, tiny_raw, train_isolated, write_yaml
from tests.env import isolate


@pytest.fixture(scope="module")
def sasrec_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trained SASRec whose item embeddings the tokenizer quantises (synthetic items have
    no text)."""
    root = tmp_path_factory.mktemp("sasrec")
    return train_isolated(tiny_raw(train={"max_epochs": 2}), root / "run", root / "cache")


@pytest.fixture(scope="module")
def tiger_run(sasrec_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiger")
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, root / "cache")
        config = write_yaml(root / "tiger.yaml", tiger_raw(sasrec_run))
        assert main(["train", "--config", str(config), "--out", str(root / "run")]) == 0
    return root / "run"


def test_training_fits_semantic_ids_into_the_run(tiger_run: Path) -> None:
    ids = SemanticIds.load(tiger_run / SEMANTIC_IDS)
    assert ids.num_levels == 3  # two RQ-KMeans levels + disambiguation
    assert ids.codebook_sizes[:2] == (8, 8)
    assert (tiger_run / SEMANTIC_IDS / "tokenizer.pt").is_file()
    config = json.loads((tiger_run / "config.json").read_text())
    assert tuple(config["model"]["codebook_sizes"]) == ids.codebook_sizes
    assert config["tokenizer"]["method"] == "rqkmeans"
    run = load_run(tiger_run)  # the checkpoint alone carries the codes
    assert np.array_equal(run.model.item_codes.numpy(), ids.codes)  # type: ignore[arg-type]
    results = json.loads((tiger_run / "results.json").read_text())
    assert 0.0 <= results["NDCG@10"] <= results["HR@10"] <= 1.0


def test_evaluate_and_recommend_a_generative_run(
    tiger_run: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    isolate_dir = tmp_path / "cache"
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, isolate_dir)
        assert main(["evaluate", str(tiger_run), "--json"]) == 0
        again = json.loads(capsys.readouterr().out)
        results = json.loads((tiger_run / "results.json").read_text())
        assert again["NDCG@10"] == pytest.approx(results["NDCG@10"])
        assert again["ranked_within"] == 10  # its own top-10 list: eval.ks' largest
        ranks_file = tmp_path / "ranks.csv"
        assert main(["evaluate", str(tiger_run), "--export-ranks", str(ranks_file), "-q"]) == 0
        ranks = pl.read_csv(ranks_file)["rank"]
        assert ranks.max() <= 10  # a target outside the list has no rank, not rank 11
        assert ranks.is_not_null().mean() == pytest.approx(again["HR@10"])
        assert "ranked within the model's own top-10 list" in capsys.readouterr().out
        assert main(["evaluate", str(tiger_run), "--json", "--set", "model.beam_size=20"]) == 0
        wider = json.loads(capsys.readouterr().out)
        assert wider["HR@10"] >= 0.0
        catalogue = len(load_run(tiger_run).id_map.items)
        past = [
            "--set",
            f"eval.ks=[{catalogue + 50}]",
            "--set",
            f"model.beam_size={catalogue + 50}",
        ]
        assert main(["evaluate", str(tiger_run), "--json", *past]) == 0
        # a list holds at most the catalogue: it said "ranked within" the k asked for
        assert json.loads(capsys.readouterr().out)["ranked_within"] == catalogue
        run = load_run(tiger_run)
        history = list(run.id_map.items[:25])  # longer than max_seq_len
        assert main(["recommend", str(tiger_run), "--history", *history, "-k", "7", "--json"]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    assert len(items) == 7
    assert not set(items) & set(history)  # the whole history is excluded, not only the window
    assert main(["recommend", str(tiger_run), "--history", *history, "-k", "3"]) == 0
    table = capsys.readouterr().out.splitlines()[1:]
    assert [line.split()[-1] for line in table] == ["-"] * 3  # no scores: it printed "nan"


def test_another_run_reuses_the_semantic_ids(
    tiger_run: Path, sasrec_run: Path, tmp_path: Path
) -> None:
    raw = tiger_raw(sasrec_run, name="trierec")
    raw["tokenizer"] = {"from_run": str(tiger_run)}
    raw["train"]["max_epochs"] = 1
    run_dir = train_isolated(raw, tmp_path / "trierec", tmp_path / "cache")
    ours = SemanticIds.load(run_dir / SEMANTIC_IDS)
    theirs = SemanticIds.load(tiger_run / SEMANTIC_IDS)
    assert np.array_equal(ours.codes, theirs.codes)
    assert (run_dir / SEMANTIC_IDS / "tokenizer.pt").is_file()


def test_semantic_ids_of_other_data_are_refused(
    tiger_run: Path, sasrec_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = tiger_raw(sasrec_run)
    raw["tokenizer"] = {"from_run": str(tiger_run)}
    raw["data"]["synthetic_items"] = 150  # another catalogue
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, tmp_path / "cache")
        config = write_yaml(tmp_path / "other.yaml", raw)
        assert main(["train", "--config", str(config), "--out", str(tmp_path / "run")]) != 0
    assert "another item catalogue" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_codebook_sizes_come_from_the_tokenizer(
    tiger_run: Path, sasrec_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = tiger_raw(sasrec_run, codebook_sizes=[8, 8, 99])
    raw["tokenizer"] = {"from_run": str(tiger_run)}
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, tmp_path / "cache")
        config = write_yaml(tmp_path / "sizes.yaml", raw)
        assert main(["train", "--config", str(config), "--out", str(tmp_path / "run")]) != 0
    assert "the tokenizer section decides it" in capsys.readouterr().err


def test_resuming_a_finished_run_keeps_its_semantic_ids(
    tiger_run: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    codes = tiger_run / SEMANTIC_IDS / "semantic_ids.npz"
    before = (codes.stat().st_mtime_ns, codes.read_bytes())
    results = json.loads((tiger_run / "results.json").read_text())
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, tmp_path / "cache")
        assert main(["train", "--resume", "--out", str(tiger_run)]) == 0
    capsys.readouterr()
    assert (codes.stat().st_mtime_ns, codes.read_bytes()) == before  # loaded, not refitted
    assert json.loads((tiger_run / "results.json").read_text())["NDCG@10"] == pytest.approx(
        results["NDCG@10"]
    )
