"""``seqrec train`` and ``seqrec evaluate`` end to end, in-process through ``main``."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from seqrec.cli import main
from seqrec.config import TrainConfig
from seqrec.nn import selective_scan
from seqrec.training.checkpoint import load_run
from tests.cli.conftest import file_raw
from tests.cli.helpers import one_error_line, read_jsonl, tiny_raw, write_yaml

METRIC_KEYS = ("NDCG@10", "HR@10", "MRR@10", "Recall@10")


def evaluate_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["evaluate", *args, "--json"]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1, out
    result = json.loads(out)
    assert isinstance(result, dict)
    return result


def targets(log: pl.DataFrame, split: str) -> dict[str, tuple[str, list[str]]]:
    """user -> (target, history) of the leave-one-out split, from the raw log."""
    back = 1 if split == "test" else 2
    sequences = log.group_by("user_id", maintain_order=True).agg("item_id").rows()
    return {user: (items[-back], items[:-back]) for user, items in sequences}


def test_train_writes_a_complete_run_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_yaml(tmp_path / "tiny.yaml", tiny_raw())
    out = tmp_path / "run"
    assert main(["train", "--config", str(config), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "trained sasrec: 3 epochs" in printed
    assert "protocol: full ranking" in printed

    names = {p.name for p in out.iterdir()}
    assert names == {
        "config.json",
        "model.pt",
        "checkpoint.pt",
        "id_map.json",
        "metrics.jsonl",
        "results.json",
    }
    rows = read_jsonl(out / "metrics.jsonl")
    assert [row["epoch"] for row in rows] == [1, 2, 3]
    assert all(math.isfinite(row["loss"]) and "valid_NDCG@10" in row for row in rows)

    results = json.loads((out / "results.json").read_text())
    best = max(rows, key=lambda row: row["valid_NDCG@10"])
    assert results["epochs"] == 3
    assert results["best_epoch"] == best["epoch"]
    assert results["valid_NDCG@10"] == best["valid_NDCG@10"]
    assert results["split"] == "test"
    for key in METRIC_KEYS:
        assert 0.0 <= results[key] <= 1.0

    saved = json.loads((out / "config.json").read_text())
    id_map = json.loads((out / "id_map.json").read_text())
    assert saved["train"]["max_epochs"] == 3
    assert saved["train"]["seed"] == 1
    assert saved["data"]["synthetic_users"] == 300
    assert saved["model"]["hidden_size"] == 16
    assert saved["model"]["num_items"] == len(id_map["items"])
    assert len(id_map["users"]) == results["num_users"] == 300
    assert load_run(out).model.config.max_seq_len == 20


def test_set_override_changes_the_saved_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert TrainConfig().lr != 3e-4  # else this test could not fail
    config = write_yaml(tmp_path / "tiny.yaml", tiny_raw(train={"max_epochs": 1}))
    out = tmp_path / "run"
    args = ["train", "--config", str(config), "--out", str(out), "--set", "train.lr=3e-4"]
    assert main(args) == 0
    saved = json.loads((out / "config.json").read_text())
    assert saved["train"]["lr"] == 3e-4
    assert saved["train"]["max_epochs"] == 1


def test_a_config_the_trainer_refuses_leaves_no_run_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """GRU4Rec's loss couples a batch's rows; the retry with the value the error asks for
    must then succeed (a stub run directory would refuse it)."""
    config = write_yaml(tmp_path / "c.yaml", tiny_raw(model={"name": "gru4rec"}))
    args = ["train", "--config", str(config), "--out", str(tmp_path / "runs" / "gru")]
    assert main([*args, "--set", "train.batch_parts=2"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "train.batch_parts needs a loss that splits by rows" in line
    assert not (tmp_path / "runs").exists()
    assert main([*args, "--set", "train.batch_parts=1"]) == 0
    assert (tmp_path / "runs" / "gru" / "results.json").is_file()


def test_a_run_trained_on_a_relative_data_path_evaluates_from_elsewhere(
    log_csv: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    project = tmp_path / "project"
    (project / "d").mkdir(parents=True)
    shutil.copyfile(log_csv, project / "d" / "log.csv")
    raw = file_raw(log_csv)
    raw["data"]["path"] = "d/log.csv"
    monkeypatch.chdir(project)
    write_yaml(project / "c.yaml", raw)
    train = ["train", "--config", "c.yaml", "--out", "run"]
    assert main(train) == 0
    capsys.readouterr()
    saved_path = project / "run" / "config.json"
    saved = json.loads(saved_path.read_text())
    assert saved["data"]["path"] == str(project / "d" / "log.csv")

    monkeypatch.chdir(tmp_path)
    result = evaluate_json(capsys, str(project / "run"))
    assert result["num_users"] == 300
    expected = json.loads((project / "run" / "results.json").read_text())
    assert result["NDCG@10"] == pytest.approx(expected["NDCG@10"], abs=1e-12)

    # --resume compares the same normalised path, also with a run saved before this change.
    monkeypatch.chdir(project)
    assert main([*train, "--resume"]) == 0
    saved["data"]["path"] = "d/log.csv"
    saved_path.write_text(json.dumps(saved))
    assert main([*train, "--resume"]) == 0


def test_evaluate_prints_a_table_naming_the_protocol(
    file_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["evaluate", str(file_run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    results = json.loads((file_run / "results.json").read_text())
    assert "test split, 300 users" in lines[0]
    assert lines[1].startswith("protocol: full ranking over all ")
    assert "filter-seen" in lines[1]
    assert lines[3].split() == ["K", "HR", "NDCG", "MRR", "Recall"]
    rows = {line.split()[0]: line for line in lines[4:]}
    assert sorted(rows, key=int) == ["5", "10", "20"]
    for key in METRIC_KEYS:
        assert f"{results[key]:.4f} ± " in rows["10"]


def test_evaluate_json_is_one_flat_object(
    file_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = evaluate_json(capsys, str(file_run))
    assert set(result) >= {*METRIC_KEYS, "protocol", "split", "num_users"}
    assert all(isinstance(value, (int, float, str)) for value in result.values())
    assert result["split"] == "test"
    assert result["num_users"] == 300
    assert result["protocol"].startswith("full ranking")
    saved = json.loads((file_run / "results.json").read_text())
    for key in METRIC_KEYS:
        assert result[key] == pytest.approx(saved[key], abs=1e-12)


def test_sampled_protocol_ranks_among_sampled_negatives(
    file_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full = evaluate_json(capsys, str(file_run))
    sampled = evaluate_json(capsys, str(file_run), "--protocol", "sampled")
    assert sampled["protocol"].startswith("sampled: target + 100 uniform")
    assert sampled["num_users"] == full["num_users"]
    # 100 negatives out of the unseen items can only move a target up
    assert sampled["HR@10"] > full["HR@10"]
    assert sampled["NDCG@10"] > full["NDCG@10"]
    assert evaluate_json(capsys, str(file_run), "--protocol", "sampled") == sampled  # seeded


def test_valid_split(file_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    valid = evaluate_json(capsys, str(file_run), "--split", "valid")
    test = evaluate_json(capsys, str(file_run))
    assert valid["split"] == "valid"
    assert valid["num_users"] == 300
    assert valid["NDCG@10"] != test["NDCG@10"]
    best = max(read_jsonl(file_run / "metrics.jsonl"), key=lambda row: row["valid_NDCG@10"])
    assert valid["NDCG@10"] == pytest.approx(best["valid_NDCG@10"], abs=1e-6)


def test_set_eval_changes_the_protocol_of_one_evaluation(
    file_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    default = evaluate_json(capsys, str(file_run))
    cut_offs = evaluate_json(capsys, str(file_run), "--set", "eval.ks=[1,50]")
    assert {"HR@1", "HR@50"} <= set(cut_offs)
    assert "HR@10" not in cut_offs
    assert cut_offs["NDCG@1"] == cut_offs["HR@1"] <= default["HR@5"] <= cut_offs["HR@50"]
    by_set = evaluate_json(capsys, str(file_run), "--set", "eval.protocol=sampled")
    assert by_set == evaluate_json(capsys, str(file_run), "--protocol", "sampled")
    fewer = evaluate_json(
        capsys, str(file_run), "--protocol", "sampled", "--set", "eval.num_negatives=20"
    )
    assert fewer["protocol"].startswith("sampled: target + 20 uniform")
    assert fewer["HR@10"] > by_set["HR@10"]  # 20 negatives instead of 100: an easier list
    assert evaluate_json(capsys, str(file_run)) == default  # the run's own config is unchanged


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--set", "eval.foo=1"], "unknown key(s) eval.foo; valid eval keys: batch_size"),
        (["--set", "eval.ks=[0]"], "eval.ks must be positive integers"),
        (["--set", "eval.protocol=exhaustive"], "eval.protocol: 'exhaustive' is not one of"),
        (
            ["--set", "eval.protocol=full", "--protocol", "sampled"],
            "--set eval.protocol=full disagrees with --protocol",
        ),
        (["--set", "data.max_seq_len=5"], "only model.key=value and eval.key=value can change"),
        # settings the protocol in use does not read: they once changed nothing, silently
        (
            ["--set", "eval.num_negatives=50"],
            "eval.num_negatives only applies to the sampled protocol, and this evaluation uses "
            "the full one (--protocol)",
        ),
        (
            ["--protocol", "sampled", "--no-filter-seen"],
            "eval.filter_seen only applies to the full protocol, and this evaluation uses the "
            "sampled one",
        ),
    ],
)
def test_set_on_evaluate_refuses_bad_or_training_settings(
    file_run: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], message: str
) -> None:
    assert main(["evaluate", str(file_run), *overrides]) == 2
    assert message in one_error_line(capsys.readouterr().err)


def test_sampled_with_filter_seen_is_what_it_does_anyway(
    file_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only --no-filter-seen is refused with it (the docs' commands pass --filter-seen)."""
    sampled = evaluate_json(capsys, str(file_run), "--protocol", "sampled")
    assert evaluate_json(capsys, str(file_run), "--protocol", "sampled", "--filter-seen") == sampled


def read_ranks(path: Path) -> pl.DataFrame:
    if path.suffix == ".csv":
        return pl.read_csv(path, schema_overrides={"user_id": pl.String, "target": pl.String})
    return pl.read_parquet(path)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
@pytest.mark.parametrize("split", ["test", "valid"])
def test_exported_ranks_reproduce_the_metrics_with_original_ids(
    file_run: Path,
    log: pl.DataFrame,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    suffix: str,
    split: str,
) -> None:
    path = tmp_path / f"ranks{suffix}"
    result = evaluate_json(capsys, str(file_run), "--split", split, "--export-ranks", str(path))
    frame = read_ranks(path)
    assert frame.columns == ["user_id", "target", "rank", "protocol"]
    assert frame.height == result["num_users"] == 300
    assert frame["protocol"].unique().to_list() == [result["protocol"]]

    expected = targets(log, split)
    assert sorted(frame["user_id"]) == sorted(expected)  # original "u<n>" ids, every user once
    for user, target in frame.select("user_id", "target").rows():
        assert target == expected[user][0], user

    ranks = frame["rank"].to_list()
    num_items = log["item_id"].n_unique()
    assert all(1 <= rank <= num_items + 1 for rank in ranks)  # N + 1: a target filtered out
    hits = [rank for rank in ranks if rank <= 10]
    assert result["HR@10"] == pytest.approx(len(hits) / len(ranks), abs=1e-12)
    assert result["Recall@10"] == pytest.approx(len(hits) / len(ranks), abs=1e-12)
    ndcg = sum(1 / math.log2(rank + 1) for rank in hits) / len(ranks)
    assert result["NDCG@10"] == pytest.approx(ndcg, abs=1e-12)
    assert result["MRR@10"] == pytest.approx(sum(1 / rank for rank in hits) / len(ranks), abs=1e-12)
    assert not list(tmp_path.glob(".*.tmp"))


def test_csv_and_parquet_exports_agree(
    file_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for suffix in (".csv", ".parquet"):
        assert (
            main(["evaluate", str(file_run), "--export-ranks", str(tmp_path / f"r{suffix}")]) == 0
        )
    capsys.readouterr()
    assert read_ranks(tmp_path / "r.csv").equals(read_ranks(tmp_path / "r.parquet"))


def test_no_filter_seen_changes_results_on_data_with_repeats(
    file_run: Path, log: pl.DataFrame, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = targets(log, "test")
    repeats = {user for user, (target, history) in expected.items() if target in history}
    assert len(repeats) >= 5, "the synthetic log should have test targets the user saw before"

    filtered = evaluate_json(capsys, str(file_run), "--export-ranks", str(tmp_path / "f.csv"))
    kept = evaluate_json(
        capsys, str(file_run), "--no-filter-seen", "--export-ranks", str(tmp_path / "k.csv")
    )
    assert "filter-seen" in filtered["protocol"]
    assert "seen items kept" in kept["protocol"]
    assert kept["NDCG@10"] != filtered["NDCG@10"]
    assert evaluate_json(capsys, str(file_run), "--filter-seen") == filtered

    f = dict(read_ranks(tmp_path / "f.csv").select("user_id", "rank").rows())
    k = dict(read_ranks(tmp_path / "k.csv").select("user_id", "rank").rows())
    for user in expected:
        if user in repeats:  # the target is filtered out with the history: always a miss
            assert f[user] > 10, user
        else:  # history items only compete with the target when they are kept
            assert k[user] >= f[user], user
    assert any(k[user] <= 10 for user in repeats)


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()}


def test_resume_on_data_whose_ids_changed_is_refused(
    log_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Renaming one item shifts the internal ids of others: the resumed epochs once trained
    the old weights against other items, and id_map.json stayed the old one."""
    log = tmp_path / "log.csv"
    shutil.copy(log_csv, log)
    config = write_yaml(tmp_path / "c.yaml", {**file_raw(log), "train": {"max_epochs": 1}})
    run = tmp_path / "run"
    assert main(["train", "--config", str(config), "--out", str(run)]) == 0
    frame = pl.read_csv(log, infer_schema=False)
    renamed = frame["item_id"][0]
    frame.with_columns(pl.col("item_id").replace(renamed, "zz-renamed")).write_csv(log)
    capsys.readouterr()
    before = folder_bytes(run)
    args = ["train", "--out", str(run), "--resume", "--set", "train.max_epochs=2"]
    assert main(args) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: --resume: the data no longer matches {run / 'id_map.json'} (the file or its "
        "preprocessing changed since the run started); resume with the data it was started "
        "on, or start a new --out"
    )
    assert folder_bytes(run) == before


def test_data_with_the_same_ids_but_other_interactions_is_refused(
    log_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An edited log keeping every user and item evaluated the run on another split (its new
    test targets were training targets of the run) with no word, and resumed on it."""
    log = tmp_path / "log.csv"
    shutil.copy(log_csv, log)
    config = write_yaml(tmp_path / "c.yaml", {**file_raw(log), "train": {"max_epochs": 1}})
    run = tmp_path / "run"
    assert main(["train", "--config", str(config), "--out", str(run)]) == 0
    assert main(["evaluate", str(run)]) == 0  # the unchanged file is the run's data
    frame = pl.read_csv(log, infer_schema=False)
    reversed_time = (10**9 - pl.col("timestamp").cast(pl.Int64)).cast(pl.String)
    frame.with_columns(reversed_time.alias("timestamp")).write_csv(log)
    capsys.readouterr()
    assert main(["evaluate", str(run)]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "error: the data has the run's users and items but other interactions (the file "
        "changed since training), so its split would not be the one the run held out: "
        "evaluate with the data it was trained on"
    )
    before = folder_bytes(run)
    assert main(["train", "--out", str(run), "--resume", "--set", "train.max_epochs=2"]) == 2
    assert "--resume: the data has the users and items" in capsys.readouterr().err
    assert folder_bytes(run) == before
    warm = ["train", "--config", str(config), "--set", f"train.init_from={run}"]
    assert main([*warm, "--out", str(tmp_path / "warm")]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: train.init_from: {run} was trained on other interactions of these users and "
        "items (the data changed since)"
    )


def test_a_run_trained_with_a_kernel_missing_here_warm_starts_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source was rebuilt with its own model.scan, which this machine cannot run."""
    model = {"name": "mamba4rec", "hidden_size": 16, "state_size": 4, "max_seq_len": 20}
    config = write_yaml(tmp_path / "c.yaml", tiny_raw(model=model, train={"max_epochs": 1}))
    source = tmp_path / "source"
    assert main(["train", "--config", str(config), "--out", str(source)]) == 0
    saved = json.loads((source / "config.json").read_text())
    saved["model"]["scan"] = "cuda"  # as trained on a GPU with mamba-ssm
    (source / "config.json").write_text(json.dumps(saved))
    monkeypatch.setattr(selective_scan, "_mamba_kernel", lambda: None)
    warm = ["train", "--config", str(config), "--set", f"train.init_from={source}"]
    assert main([*warm, "--out", str(tmp_path / "warm")]) == 0


def test_out_holding_files_a_run_writes_but_no_run_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """They were replaced without a word (results.json, model.pt, metrics.jsonl)."""
    config = write_yaml(tmp_path / "c.yaml", tiny_raw(train={"max_epochs": 1}))
    out = tmp_path / "mine"
    out.mkdir()
    (out / "results.json").write_text("my notes\n")
    (out / "notes.txt").write_text("kept\n")
    assert main(["train", "--config", str(config), "--out", str(out)]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: {out} holds results.json but no run (config.json): training there would "
        "replace them; choose a new --out, or move them away"
    )
    assert folder_bytes(out) == {"results.json": b"my notes\n", "notes.txt": b"kept\n"}
    (out / "results.json").unlink()  # other files are no reason to refuse
    assert main(["train", "--config", str(config), "--out", str(out)]) == 0
    assert (out / "notes.txt").read_text() == "kept\n"
