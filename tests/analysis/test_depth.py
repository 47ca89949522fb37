"""RecRec's two stages through the training loop, inference depth, and the depth curve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from seqrec.analysis.depth import MAX_DEPTH, _DepthSweep, analyze_depth, depth_summary_lines
from seqrec.config import ConfigError, experiment_from_raw
from seqrec.models import build_model, build_model_config
from seqrec.training.checkpoint import WEIGHTS, load_torch
from seqrec.training.run import evaluate_run, train_experiment
from tests.cli.helpers import tiny_raw, train_isolated

MODEL = {"name": "recrec", "hidden_size": 16, "max_seq_len": 20, "num_interests": 4}
STAGE_2 = {"stage": 2, "rounds": 2, "steps_per_round": 2, "inner_steps": 1}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Stage 1 (2 epochs) and stage 2 from it (1 epoch) on 300 synthetic users."""
    root = tmp_path_factory.mktemp("recrec")
    stage_1 = train_isolated(
        tiny_raw(model=MODEL, train={"max_epochs": 2}), root / "stage1", root / "cache"
    )
    raw = tiny_raw(model={**MODEL, **STAGE_2}, train={"max_epochs": 1, "init_from": str(stage_1)})
    return stage_1, train_isolated(raw, root / "stage2", root / "cache")


def test_stage_2_starts_from_stage_1_and_keeps_its_weights(runs: tuple[Path, Path]) -> None:
    stage_1, stage_2 = runs
    first, second = load_torch(stage_1 / WEIGHTS), load_torch(stage_2 / WEIGHTS)
    assert set(first) < set(second)
    for name, tensor in first.items():  # backbone and compressor: loaded, then frozen
        assert torch.equal(second[name], tensor), name
    assert any(name.startswith("reasoner.") for name in second)
    assert "s0" in second


def test_each_stage_logs_the_terms_of_its_loss(runs: tuple[Path, Path]) -> None:
    stage_1, stage_2 = runs
    for line in (stage_1 / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)  # stage 1: CE + lambda_IDR * IDR, lambda = 0.1 by default
        assert row["loss"] == pytest.approx(row["loss_next_item"] + 0.1 * row["loss_idr"])
    (row,) = [json.loads(line) for line in (stage_2 / "metrics.jsonl").read_text().splitlines()]
    rounds = [row["loss_round_1"], row["loss_round_2"]]  # K = 2 rounds of deep supervision
    assert row["loss"] == pytest.approx(sum(rounds) / 2)


def test_depth_zero_of_stage_2_is_the_stage_1_model(runs: tuple[Path, Path]) -> None:
    stage_1, stage_2 = runs
    at_zero, _ = evaluate_run(stage_2, settings={"depth": 0})
    assert at_zero.metrics == evaluate_run(stage_1)[0].metrics
    with pytest.raises(ConfigError, match="model.num_interests cannot change after training"):
        evaluate_run(stage_2, settings={"num_interests": 2})


def test_a_finished_stage_2_run_resumes(runs: tuple[Path, Path]) -> None:
    _, stage_2 = runs
    config = json.loads((stage_2 / "config.json").read_text())
    raw = {k: config[k] for k in ("data", "train", "eval")}
    raw["model"] = {k: v for k, v in config["model"].items() if k not in ("num_items", "num_users")}
    outcome = train_experiment(experiment_from_raw(raw), stage_2, resume=True)  # optimizer state
    assert outcome.fit.epochs == 1


def test_init_from_is_checked_before_training(runs: tuple[Path, Path], tmp_path: Path) -> None:
    stage_1, _ = runs
    missing = tiny_raw(model={**MODEL, **STAGE_2}, train={"init_from": str(tmp_path / "nope")})
    with pytest.raises(ConfigError, match=r"train.init_from: run directory .*nope does not exist"):
        train_experiment(experiment_from_raw(missing), tmp_path / "a")
    other = tiny_raw(
        model={**MODEL, **STAGE_2, "hidden_size": 12}, train={"init_from": str(stage_1)}
    )
    with pytest.raises(ConfigError, match=r"incompatible model config \(model.hidden_size: 16"):
        train_experiment(experiment_from_raw(other), tmp_path / "b")
    assert not (tmp_path / "a").exists()
    assert not (tmp_path / "b").exists()


def test_analyze_depth_writes_the_curve(runs: tuple[Path, Path], tmp_path: Path) -> None:
    stage_1, stage_2 = runs
    report = analyze_depth(stage_2, tmp_path / "depth", max_depth=2)
    rows = json.loads((tmp_path / "depth" / "depth.json").read_text())
    assert [row["depth"] for row in rows] == [0, 1, 2]
    assert all(0.0 <= row["NDCG@10"] <= row["Recall@10"] <= row["Recall@20"] <= 1 for row in rows)
    assert all(-1.0 <= row["interest_cosine"] <= 1.0 for row in rows)
    assert rows[0]["NDCG@10"] == evaluate_run(stage_1)[0].metrics["NDCG@10"]
    for row in rows:  # the one-pass sweep scores each depth as evaluate does
        at_depth, _ = evaluate_run(stage_2, settings={"depth": row["depth"]})
        assert row["NDCG@10"] == pytest.approx(at_depth.metrics["NDCG@10"], abs=1e-12)
        assert row["Recall@10"] == pytest.approx(at_depth.metrics["Recall@10"], abs=1e-12)
    assert (tmp_path / "depth" / "depth.csv").is_file()
    assert (tmp_path / "depth" / "depth.png").stat().st_size > 0
    assert "best N =" in report.read_text()
    assert depth_summary_lines(rows)[0].startswith("best N =")


def test_one_interest_has_no_interest_cosine_column() -> None:
    config = build_model_config({**MODEL, **STAGE_2, "num_interests": 1}, num_items=30)
    sweep = _DepthSweep(build_model(config), max_depth=2)
    list(sweep(torch.tensor([[0, 3, 4, 5]]), torch.tensor([1])))
    assert sweep.mean_cosines() is None  # no pair of interests: not a cosine of 0


def test_analyze_depth_refuses_models_without_a_depth(
    runs: tuple[Path, Path], pop_run: Path, tmp_path: Path
) -> None:
    stage_1, _ = runs
    with pytest.raises(ConfigError, match="stage-1 RecRec has no reasoner"):
        analyze_depth(stage_1, tmp_path, max_depth=2)
    with pytest.raises(ConfigError, match="'pop' has no inference depth"):
        analyze_depth(pop_run, tmp_path, max_depth=2)
    _, stage_2 = runs
    for max_depth in (-1, MAX_DEPTH + 1):  # each depth holds every user's rank: bounded
        with pytest.raises(
            ConfigError, match=rf"--max-depth must be in 0\.\.256, got {max_depth}$"
        ):
            analyze_depth(stage_2, tmp_path, max_depth=max_depth)


def test_the_summary_names_the_largest_gain_or_says_there_is_none() -> None:
    def rows(ndcg: list[float]) -> list[dict[str, float]]:
        return [{"depth": depth, "NDCG@10": value} for depth, value in enumerate(ndcg)]

    rising = depth_summary_lines(rows([0.040, 0.041, 0.044, 0.043]))
    assert rising[0] == "best N = 2: NDCG@10 0.0440"
    assert "largest single-step gain: N = 1 -> 2 (+0.0030)" in rising[1]
    assert rising[2] == "N = 3: 2.3% below the best N"
    falling = depth_summary_lines(rows([0.045, 0.044, 0.040]))
    assert falling[0] == "best N = 0: NDCG@10 0.0450"
    assert falling[1].endswith("no step raises NDCG@10")
