"""``--set model.KEY=VALUE`` on a trained run (RecRec's depth) and ``seqrec analyze depth``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.helpers import one_error_line, run_seqrec, train_recrec_stage_2


@pytest.fixture(scope="module")
def stage_2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_recrec_stage_2(tmp_path_factory.mktemp("recrec-cli"))


def evaluate_json(run: Path, *args: str) -> dict[str, float]:
    done = run_seqrec("evaluate", run, "--json", *args)
    assert done.returncode == 0, done.stderr
    result: dict[str, float] = json.loads(done.stdout)
    return result


def test_depth_is_an_inference_setting_of_evaluate(stage_2: Path) -> None:
    default = evaluate_json(stage_2)
    zero = evaluate_json(stage_2, "--set", "model.depth=0")
    same = evaluate_json(stage_2, "--set", "model.depth=4")  # the training depth K * T
    assert same["NDCG@20"] == default["NDCG@20"]
    assert zero["NDCG@20"] != default["NDCG@20"]


def test_recommend_takes_the_depth_too(stage_2: Path) -> None:
    ranked = {}
    for depth in ("0", "6"):
        done = run_seqrec(
            "recommend",
            stage_2,
            "--history",
            "1",
            "2",
            "3",
            "--json",
            "--set",
            f"model.depth={depth}",
        )
        assert done.returncode == 0, done.stderr
        ranked[depth] = json.loads(done.stdout)["scores"]
    assert ranked["0"] != ranked["6"]


@pytest.mark.parametrize(
    ("command", "override", "message"),
    [
        ("evaluate", "model.hidden_size=8", "model.hidden_size cannot change after training"),
        ("evaluate", "train.lr=0.1", "only model.key=value and eval.key=value can change"),
        ("recommend", "eval.ks=[5]", "only model.key=value can change on a trained run"),
    ],
)
def test_other_settings_are_refused(
    stage_2: Path, command: str, override: str, message: str
) -> None:
    extra = ("--history", "1") if command == "recommend" else ()
    done = run_seqrec(command, stage_2, *extra, "--set", override)
    assert done.returncode == 2
    assert message in one_error_line(done.stderr)


def test_analyze_depth_command(stage_2: Path, tmp_path: Path) -> None:
    done = run_seqrec("analyze", "depth", stage_2, "--max-depth", "2", "--out", tmp_path)
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / "depth.json").read_text())
    assert [row["depth"] for row in rows] == [0, 1, 2]
    assert f"report: {tmp_path / 'depth.md'}" in done.stdout


def test_predictor_settings_apply_to_one_call_only(stage_2: Path) -> None:
    from seqrec.config import ConfigError
    from seqrec.serving.predictor import Predictor

    predictor = Predictor.from_run_dir(stage_2)
    assert predictor.inference_settings == ("depth",)
    items = list(predictor.id_map.items)
    histories = [items[:8], items[10:25], items[3:5]]
    default = predictor.recommend(histories, 10)
    shallow = predictor.recommend(histories, 10, settings={"depth": 0})
    assert [r.scores for r in shallow] != [r.scores for r in default]
    loaded_shallow = Predictor.from_run_dir(stage_2, settings={"depth": 0})
    for ours, theirs in zip(shallow, loaded_shallow.recommend(histories, 10), strict=True):
        assert ours.items == theirs.items
        assert ours.scores == pytest.approx(theirs.scores, abs=1e-6)
    assert predictor.recommend(histories, 10) == default  # the loaded depth is back
    with pytest.raises(ConfigError, match="model.hidden_size cannot change after training"):
        predictor.recommend(histories, 10, settings={"hidden_size": 8})
