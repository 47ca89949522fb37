"""Seeded training is reproducible on CPU; early stopping keeps the best epoch's weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqrec.cli import main
from tests.cli.helpers import losses, read_jsonl, tiny_raw, without_timings, write_yaml


def train(tmp_path: Path, name: str, config: Path, *sets: str) -> Path:
    out = tmp_path / name
    overrides = [arg for s in sets for arg in ("--set", s)]
    assert main(["train", "--config", str(config), "--out", str(out), *overrides]) == 0
    return out


def test_same_seed_gives_identical_losses_and_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_yaml(tmp_path / "c.yaml", tiny_raw())
    a = train(tmp_path, "a", config)
    b = train(tmp_path, "b", config)
    other = train(tmp_path, "other", config, "train.seed=2")
    capsys.readouterr()

    assert len(losses(a)) == 3
    assert losses(a) == losses(b)
    assert without_timings(read_jsonl(a / "metrics.jsonl")) == without_timings(
        read_jsonl(b / "metrics.jsonl")
    )
    assert (a / "results.json").read_text() == (b / "results.json").read_text()
    assert losses(other) != losses(a)  # the seed is what makes them equal


def test_early_stopping_keeps_the_best_epoch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = tiny_raw(train={"max_epochs": 30, "patience": 1, "lr": 0.01})
    out = train(tmp_path, "run", write_yaml(tmp_path / "c.yaml", raw))
    capsys.readouterr()

    rows = read_jsonl(out / "metrics.jsonl")
    values = [row["valid_NDCG@10"] for row in rows]
    best = max(range(len(rows)), key=values.__getitem__)
    assert len(rows) < 30, "the run should have stopped early"
    assert len(rows) == best + 1 + 1  # patience 1: one epoch without improvement
    assert values[-1] <= values[best]
    results = json.loads((out / "results.json").read_text())
    assert results["epochs"] == len(rows)
    assert results["best_epoch"] == rows[best]["epoch"]
    assert results["valid_NDCG@10"] == values[best]

    assert main(["evaluate", str(out), "--split", "valid", "--json"]) == 0
    valid = json.loads(capsys.readouterr().out)
    assert valid["NDCG@10"] == pytest.approx(values[best], abs=1e-6)
    assert valid["NDCG@10"] != pytest.approx(values[-1], abs=1e-6)  # not the last weights
    for key in ("HR@10", "MRR@10"):
        assert valid[key] == pytest.approx(rows[best][f"valid_{key}"], abs=1e-6)


def test_time_budget_stops_after_the_epoch_that_reaches_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 0.0001 minutes is reached during the first epoch: training stops after it.
    raw = tiny_raw(train={"max_epochs": 5, "time_budget_minutes": 0.0001})
    out = train(tmp_path, "run", write_yaml(tmp_path / "c.yaml", raw))
    assert len(read_jsonl(out / "metrics.jsonl")) == 1
    raw = tiny_raw(train={"max_epochs": 2, "time_budget_minutes": 60})  # never reached
    out = train(tmp_path, "run2", write_yaml(tmp_path / "c2.yaml", raw))
    assert len(read_jsonl(out / "metrics.jsonl")) == 2
    capsys.readouterr()


def refuse_constant(name: str) -> None:
    raise AssertionError(f"{name} is not standard JSON")


def test_an_epoch_that_ends_training_is_validated_whatever_eval_every_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A budget reached before the first validation (eval_every 5) saved the initial weights,
    with valid NDCG@10 -Infinity in results.json, which is not JSON."""
    raw = tiny_raw(train={"max_epochs": 10, "eval_every": 5, "time_budget_minutes": 0.0001})
    out = train(tmp_path, "run", write_yaml(tmp_path / "c.yaml", raw))
    capsys.readouterr()
    (row,) = read_jsonl(out / "metrics.jsonl")
    results = json.loads((out / "results.json").read_text(), parse_constant=refuse_constant)
    assert results["best_epoch"] == 1
    assert results["valid_NDCG@10"] == row["valid_NDCG@10"] > 0
