"""Crash-safe training: SIGKILL then ``--resume``, resuming finished runs, atomic writes."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from seqrec.cli import main
from seqrec.config import ConfigError, experiment_from_raw
from seqrec.data.prepare import prepare
from seqrec.data.schema import DataError
from seqrec.io import atomic_path
from seqrec.models.base import build_model, build_model_config
from seqrec.training.checkpoint import RunDirError, load_torch, read_config, save_torch
from seqrec.training.loop import FitResult, Trainer, seed_everything
from seqrec.training.run import train_experiment
from tests.cli.helpers import (
    SEQREC,
    assert_rows_close,
    cli_env,
    isolate,
    one_error_line,
    read_jsonl,
    run_seqrec,
    tiny_raw,
    train_isolated,
    without_timings,
    write_yaml,
)

# Long enough that a poll every few milliseconds catches the run before its last epoch.
KILL_RAW = tiny_raw(train={"max_epochs": 10, "patience": 100})


def digest(folder: Path) -> dict[str, str]:
    """Each file's hash; a folder (e.g. a checkpoint.pt that is one) only by name."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "folder"
        for p in sorted(folder.iterdir())
    }


def temp_files(folder: Path) -> list[Path]:
    return sorted(folder.glob(".*.tmp"))


def completed_epochs(run_dir: Path) -> int:
    try:
        return len(read_jsonl(run_dir / "metrics.jsonl"))
    except FileNotFoundError:
        return 0


@dataclass(frozen=True)
class KilledRun:
    config: Path
    run_dir: Path


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory) -> KilledRun:
    """``seqrec train`` SIGKILLed as soon as metrics.jsonl shows a completed epoch."""
    root = tmp_path_factory.mktemp("killed")
    config = write_yaml(root / "c.yaml", KILL_RAW)
    run_dir = root / "run"
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, root / "cache")
        env = cli_env()
    with (root / "stderr.txt").open("w") as stderr:
        process = subprocess.Popen(
            [str(SEQREC), "train", "--config", str(config), "--out", str(run_dir)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            deadline = time.monotonic() + 120
            while completed_epochs(run_dir) < 1:
                assert process.poll() is None, (root / "stderr.txt").read_text()
                assert time.monotonic() < deadline, "no epoch completed in 120 s"
                time.sleep(0.002)
        finally:
            process.kill()  # SIGKILL
            process.wait()
    assert process.returncode == -9
    return KilledRun(config, run_dir)


def test_sigkill_leaves_a_loadable_checkpoint_of_a_completed_epoch(
    killed_run: KilledRun, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = load_torch(killed_run.run_dir / "checkpoint.pt")
    state = saved["state"]
    rows = read_jsonl(killed_run.run_dir / "metrics.jsonl")
    assert 1 <= state["epoch"] < KILL_RAW["train"]["max_epochs"]
    assert not state["finished"]
    assert len(state["history"]) == state["epoch"]
    assert len(rows) in (state["epoch"] - 1, state["epoch"])  # killed between the two writes
    assert rows == state["history"][: len(rows)]
    assert set(saved) == {"model", "best_model", "optimizer", "state", "rng"}
    assert not (killed_run.run_dir / "results.json").exists()

    # Not finished: there are no final weights to evaluate, and the CLI says so.
    assert main(["evaluate", str(killed_run.run_dir)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{killed_run.run_dir} has not finished training (no model.pt yet" in line
    assert f"seqrec train --out {killed_run.run_dir} --resume finishes it" in line


@pytest.mark.parametrize(
    ("signum", "status", "word"),
    [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")],
)
def test_sigterm_and_ctrl_c_stop_training_with_a_line_saying_how_to_resume(
    tmp_path: Path, signum: int, status: int, word: str
) -> None:
    """What a scheduler's stop or Ctrl-C leaves: one line, the shell's status for the
    signal, and a run that resumes."""
    config = write_yaml(tmp_path / "c.yaml", KILL_RAW)
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [str(SEQREC), "train", "--config", str(config), "--out", str(run_dir)],
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while completed_epochs(run_dir) < 1:
            assert process.poll() is None, process.stderr
            assert time.monotonic() < deadline, "no epoch completed in 120 s"
            time.sleep(0.002)
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == status
    assert stderr.splitlines()[-1] == f"{word}; a training run resumes with --resume"
    assert "Traceback" not in stderr
    assert not temp_files(run_dir)
    done = run_seqrec("train", "--config", config, "--out", run_dir, "--resume")
    assert done.returncode == 0, done.stderr


def test_resume_after_sigkill_equals_an_uninterrupted_run(
    killed_run: KilledRun, tmp_path: Path
) -> None:
    run_dir = Path(shutil.copytree(killed_run.run_dir, tmp_path / "run"))
    done = run_seqrec("train", "--config", killed_run.config, "--out", run_dir, "--resume")
    assert done.returncode == 0, done.stderr
    assert temp_files(run_dir) == []

    reference = train_isolated(KILL_RAW, tmp_path / "reference", tmp_path / "cache")
    resumed_rows = read_jsonl(run_dir / "metrics.jsonl")
    assert len(resumed_rows) == KILL_RAW["train"]["max_epochs"]
    assert_rows_close(resumed_rows, read_jsonl(reference / "metrics.jsonl"), tol=1e-6)
    resumed = json.loads((run_dir / "results.json").read_text())
    expected = json.loads((reference / "results.json").read_text())
    assert resumed.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, float):
            assert resumed[key] == pytest.approx(value, abs=1e-6), key
        else:
            assert resumed[key] == value, key


@pytest.fixture
def finished_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path]:
    config = write_yaml(tmp_path / "c.yaml", tiny_raw())
    run_dir = tmp_path / "run"
    assert main(["train", "--config", str(config), "--out", str(run_dir)]) == 0
    capsys.readouterr()
    return config, run_dir


@pytest.mark.parametrize("with_config", [True, False], ids=["config", "no-config"])
def test_resume_of_a_finished_run_returns_the_same_results(
    finished_run: tuple[Path, Path], capsys: pytest.CaptureFixture[str], with_config: bool
) -> None:
    config, run_dir = finished_run
    rows = read_jsonl(run_dir / "metrics.jsonl")
    results = json.loads((run_dir / "results.json").read_text())
    weights = load_torch(run_dir / "model.pt")

    args = ["--config", str(config)] if with_config else []
    assert main(["train", *args, "--out", str(run_dir), "--resume"]) == 0, capsys.readouterr()
    assert read_jsonl(run_dir / "metrics.jsonl") == rows  # no epoch was trained again
    resumed = json.loads((run_dir / "results.json").read_text())
    assert resumed == pytest.approx(results, abs=1e-9)
    for name, tensor in load_torch(run_dir / "model.pt").items():
        assert torch.equal(tensor, weights[name]), name


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("train.lr=0.01", "train.lr"),
        ("model.hidden_size=8", "model.hidden_size"),
        ("data.synthetic_users=250", "data.synthetic_users"),
    ],
)
def test_resume_with_a_different_config_is_refused(
    finished_run: tuple[Path, Path], capsys: pytest.CaptureFixture[str], override: str, key: str
) -> None:
    config, run_dir = finished_run
    before = digest(run_dir)
    args = ["train", "--config", str(config), "--out", str(run_dir), "--resume"]
    assert main([*args, "--set", override]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "--resume: the config differs from the one" in line
    assert key in line
    assert digest(run_dir) == before


@pytest.mark.parametrize("with_config", [True, False], ids=["config", "no-config"])
def test_resume_refuses_a_finished_run_without_its_checkpoint(
    finished_run: tuple[Path, Path], capsys: pytest.CaptureFixture[str], with_config: bool
) -> None:
    """Resuming would retrain from epoch 1 and overwrite the finished weights."""
    config, run_dir = finished_run
    (run_dir / "checkpoint.pt").unlink()  # e.g. removed to save space
    weights = (run_dir / "model.pt").read_bytes()
    before = digest(run_dir)
    args = ["--config", str(config)] if with_config else []
    assert main(["train", *args, "--out", str(run_dir), "--resume"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "(model.pt, results.json) but no checkpoint.pt to resume from" in line
    assert "choose a new --out" in line
    assert (run_dir / "model.pt").read_bytes() == weights
    assert digest(run_dir) == before


def test_resume_refuses_a_checkpoint_that_is_a_folder_before_training(
    finished_run: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    config, run_dir = finished_run
    (run_dir / "checkpoint.pt").unlink()
    (run_dir / "checkpoint.pt").mkdir()
    before = digest(run_dir)
    assert main(["train", "--config", str(config), "--out", str(run_dir), "--resume"]) == 2
    assert "checkpoint.pt is not a file" in one_error_line(capsys.readouterr().err)
    assert digest(run_dir) == before  # no epoch trained, nothing rewritten


def test_an_unreadable_checkpoint_is_named_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "checkpoint.pt"
    save_torch({"state": {"epoch": 1}}, path)

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(torch, "load", denied)
    with pytest.raises(RunDirError, match=r"cannot read .*checkpoint\.pt: Permission denied"):
        load_torch(path)


def test_resume_accepts_a_run_started_with_another_eval_chunk_size(
    finished_run: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """eval.batch_size chunks the users and changes no rank: runs started when its default
    was 1,024 resume under the newer default."""
    _, run_dir = finished_run
    saved = json.loads((run_dir / "config.json").read_text())
    saved["eval"]["batch_size"] = 1024
    (run_dir / "config.json").write_text(json.dumps(saved))
    results = json.loads((run_dir / "results.json").read_text())
    assert main(["train", "--out", str(run_dir), "--resume"]) == 0, capsys.readouterr()
    resumed = json.loads((run_dir / "results.json").read_text())
    assert resumed == pytest.approx(results, abs=1e-9)


def test_resume_refusal_names_only_the_differing_key(
    finished_run: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    config, run_dir = finished_run
    args = ["train", "--config", str(config), "--out", str(run_dir), "--resume"]
    assert main([*args, "--set", "train.lr=0.01"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "(train.lr)" in line


class Crash(Exception):
    """Stands in for a crash in the middle of an epoch."""


def test_trainer_resume_continues_exactly_where_it_stopped(tmp_path: Path) -> None:
    config = experiment_from_raw(tiny_raw(train={"max_epochs": 5, "patience": 100}))
    data = prepare(config.data)

    def trainer(run_dir: Path, on_epoch_end=None) -> Trainer:  # type: ignore[no-untyped-def]
        seed_everything(config.train.seed)
        model_config = build_model_config(
            config.model, num_items=data.num_items, num_users=data.num_users
        )
        return Trainer(build_model(model_config), data, config, run_dir, on_epoch_end)

    def crash_in_epoch_3(row: dict[str, object]) -> None:
        if row["epoch"] == 3:
            raise Crash("epoch 3")

    uninterrupted = trainer(tmp_path / "a")
    full = uninterrupted.fit()

    with pytest.raises(Crash, match="epoch 3"):
        trainer(tmp_path / "b", crash_in_epoch_3).fit()
    assert load_torch(tmp_path / "b" / "checkpoint.pt")["state"]["epoch"] == 2
    resumed = trainer(tmp_path / "b")
    assert resumed.resume()
    fit = resumed.fit()

    assert_rows_close(fit.history, full.history, tol=1e-6)
    assert without_timings(read_jsonl(tmp_path / "b" / "metrics.jsonl")) == without_timings(
        fit.history
    )
    assert (fit.best_epoch, fit.epochs) == (full.best_epoch, full.epochs)
    assert fit.stop_reason == full.stop_reason == "train.max_epochs 5 reached"
    assert fit.best_metric == pytest.approx(full.best_metric, abs=1e-6)
    expected = uninterrupted.model.state_dict()
    for name, tensor in resumed.model.state_dict().items():
        torch.testing.assert_close(tensor, expected[name], atol=1e-6, rtol=0)
    assert temp_files(tmp_path / "b") == []


def crash_in_epoch(epoch: int) -> Callable[[dict[str, object]], None]:
    def on_epoch_end(row: dict[str, object]) -> None:
        if row["epoch"] == epoch:
            raise Crash(f"epoch {epoch}")

    return on_epoch_end


@pytest.mark.parametrize("existing", [False, True], ids=["new-folder", "existing-folder"])
def test_a_failure_before_the_first_checkpoint_removes_only_what_the_run_wrote(
    tmp_path: Path, existing: bool
) -> None:
    """Else the stub (config.json, id_map.json) refuses every retry."""
    run_dir = tmp_path / "new" / "run"
    if existing:
        run_dir.mkdir(parents=True)
        (run_dir / "notes.txt").write_text("the user's")
    config = experiment_from_raw(tiny_raw(train={"max_epochs": 2}))
    with pytest.raises(Crash, match="epoch 1"):
        train_experiment(config, run_dir, on_epoch_end=crash_in_epoch(1))
    if existing:
        assert [p.name for p in run_dir.iterdir()] == ["notes.txt"]
        assert (run_dir / "notes.txt").read_text() == "the user's"
    else:
        assert not (tmp_path / "new").exists()  # the parent it created too
    assert train_experiment(config, run_dir).fit.epochs == 2


def test_a_failure_after_the_first_checkpoint_keeps_the_run_to_resume(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = experiment_from_raw(tiny_raw(train={"max_epochs": 2}))
    with pytest.raises(Crash, match="epoch 2"):
        train_experiment(config, run_dir, on_epoch_end=crash_in_epoch(2))
    assert load_torch(run_dir / "checkpoint.pt")["state"]["epoch"] == 1
    assert train_experiment(config, run_dir, resume=True).fit.epochs == 2


def test_resume_names_a_started_run_with_no_epoch_but_not_a_new_folder(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = experiment_from_raw(tiny_raw(train={"max_epochs": 1}))
    fresh = tmp_path / "fresh"
    with caplog.at_level("INFO", logger="seqrec.training.run"):
        train_experiment(config, fresh, resume=True)  # what `seqrec demo` does on a first run
    assert "no completed epoch yet" not in caplog.text
    stub = tmp_path / "stub"
    stub.mkdir()
    for name in ("config.json", "id_map.json"):
        shutil.copy(fresh / name, stub / name)
    with caplog.at_level("INFO", logger="seqrec.training.run"):
        assert train_experiment(config, stub, resume=True).fit.epochs == 1
    assert f"--resume: {stub} has no completed epoch yet; starting from epoch 1" in caplog.text


# ---------------------------------------------------------------- atomic writes
def write_then_fail(target: Path, text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text)
        raise Crash("writer failed")


def test_atomic_path_leaves_the_old_file_when_the_writer_raises(tmp_path: Path) -> None:
    target = tmp_path / "checkpoint.pt"
    target.write_text("old")
    with pytest.raises(Crash, match="writer failed"):
        write_then_fail(target, "new, half written")
    assert target.read_text() == "old"
    assert temp_files(tmp_path) == []
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_atomic_path_replaces_the_file_on_success(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "model.pt"
    with atomic_path(target) as tmp:
        assert tmp.parent == target.parent
        assert tmp.name.startswith(".model.pt.")
        assert tmp.name.endswith(".tmp")
        tmp.write_text("new")
    assert target.read_text() == "new"
    assert temp_files(target.parent) == []


class Unpicklable:
    def __reduce__(self) -> tuple[object, ...]:
        raise Crash("cannot pickle this")


def test_failed_checkpoint_save_keeps_the_previous_checkpoint_loadable(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    save_torch({"state": {"epoch": 1}, "w": torch.arange(3.0)}, path)
    with pytest.raises(Crash, match="cannot pickle this"):
        save_torch({"state": {"epoch": 2}, "w": Unpicklable()}, path)
    saved = load_torch(path)
    assert saved["state"]["epoch"] == 1
    assert torch.equal(saved["w"], torch.arange(3.0))
    assert temp_files(tmp_path) == []


def test_a_run_started_before_a_new_config_field_resumes(tmp_path: Path) -> None:
    """A field added to seqrec later is absent from an older config.json; at its default it
    must not block --resume, while a real change still does."""
    run = train_isolated(tiny_raw(train={"max_epochs": 1}), tmp_path / "run", tmp_path / "c")
    saved = json.loads((run / "config.json").read_text())
    del saved["train"]["init_from"]  # as written before train.init_from existed
    del saved["model"]["residual"]
    (run / "config.json").write_text(json.dumps(saved))
    same = tiny_raw(train={"max_epochs": 1})
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, tmp_path / "c")
        outcome = train_experiment(experiment_from_raw(same), str(run), resume=True)  # a str
        assert outcome.fit.epochs == 1  # too: it once failed on "str / str"
        changed = tiny_raw(train={"max_epochs": 1, "init_from": str(run)})
        with pytest.raises(ConfigError, match=r"differs .*\(train\.init_from\)"):
            train_experiment(experiment_from_raw(changed), run, resume=True)


def test_resuming_below_the_epochs_trained_is_refused_and_changes_nothing(
    tmp_path: Path,
) -> None:
    """It stopped at once and rewrote config.json with a max_epochs below the epochs that
    results.json reports."""
    run = train_isolated(tiny_raw(train={"max_epochs": 2}), tmp_path / "run", tmp_path / "c")
    before = {name: (run / name).read_bytes() for name in ("config.json", "results.json")}
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, tmp_path / "c")
        lower = experiment_from_raw(tiny_raw(train={"max_epochs": 1}))
        with pytest.raises(ConfigError, match=r"train\.max_epochs 1 is below the 2 epochs "):
            train_experiment(lower, run, resume=True)
    assert {name: (run / name).read_bytes() for name in before} == before


def test_a_finished_run_trains_further_with_a_larger_max_epochs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--resume --set train.max_epochs=N`` continues a finished run exactly as if it had
    been started with N; the new limit is saved, so a later plain --resume trains no more."""
    raw = tiny_raw(train={"max_epochs": 2, "patience": 100})
    short = train_isolated(raw, tmp_path / "short", tmp_path / "c")
    longer = tiny_raw(train={"max_epochs": 4, "patience": 100})
    full = train_isolated(longer, tmp_path / "full", tmp_path / "c")
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, tmp_path / "c")
        args = ["train", "--out", str(short), "--resume"]
        assert main([*args, "--set", "train.max_epochs=4"]) == 0, capsys.readouterr()
        rows = read_jsonl(short / "metrics.jsonl")
        assert_rows_close(rows, read_jsonl(full / "metrics.jsonl"), tol=1e-6)
        assert json.loads((short / "config.json").read_text())["train"]["max_epochs"] == 4
        assert main(args) == 0
        assert read_jsonl(short / "metrics.jsonl") == rows
        # What a run learns per epoch is still fixed: changing it is refused.
        assert main([*args, "--set", "train.max_epochs=5", "--set", "train.lr=0.5"]) == 2
        assert "(train.lr)" in one_error_line(capsys.readouterr().err)


def test_a_run_saved_with_fields_it_never_read_still_loads_and_resumes(
    finished_run: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """seqrec before 2026-12-07 recorded data.path beside a registry dataset (and read the
    registry dataset); the check that refuses it now must not lock such runs out."""
    _, run_dir = finished_run
    saved = json.loads((run_dir / "config.json").read_text())
    saved["data"]["path"] = "never-read.csv"
    (run_dir / "config.json").write_text(json.dumps(saved))
    results = json.loads((run_dir / "results.json").read_text())
    with caplog.at_level("WARNING", logger="seqrec.training.checkpoint"):
        assert main(["evaluate", str(run_dir), "--json"]) == 0
        assert main(["train", "--out", str(run_dir), "--resume"]) == 0
    assert (
        f"{run_dir / 'config.json'}: ignoring data.path, which the run was trained" in caplog.text
    )
    assert json.loads((run_dir / "results.json").read_text()) == pytest.approx(results, abs=1e-9)
    capsys.readouterr()


def test_objective_fields_a_wrapper_saved_in_backbone_options_are_dropped(tmp_path: Path) -> None:
    saved = {
        "data": {"dataset": "synthetic"},
        "model": {
            "name": "recrec",
            "backbone": "sasrec",
            "backbone_options": {"loss": "bce", "num_negatives": 5, "init_std": 0.02},
        },
    }
    (tmp_path / "config.json").write_text(json.dumps(saved))
    options = read_config(tmp_path)["model"]["backbone_options"]
    assert options == {"init_std": 0.02}
    build_model_config(read_config(tmp_path)["model"], num_items=10)  # refused before


def test_patience_counts_epochs_since_the_best_not_validations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """eval_every 2 with the forced validation of the last epoch (3) once counted 2 epochs
    without improvement after 1: the run was early-stopped, and resuming it to 6 epochs
    trained nothing, unlike a run started with 6."""
    scripted = {2: 0.5, 3: 0.4, 4: 0.45, 6: 0.3}  # validation NDCG@10 by epoch

    def validate(self: Trainer) -> dict[str, float]:
        return {"NDCG@10": scripted[self.state.epoch + 1]}

    monkeypatch.setattr(Trainer, "validate", validate)

    def fit(max_epochs: int, resume: bool) -> FitResult:
        train = {"eval_every": 2, "patience": 2, "max_epochs": max_epochs}
        config = experiment_from_raw(tiny_raw(train=train))
        data = prepare(config.data)
        model_config = build_model_config(config.model, num_items=data.num_items)
        trainer = Trainer(build_model(model_config), data, config, tmp_path / "run")
        assert trainer.resume() == resume
        return trainer.fit()

    first = fit(3, resume=False)
    assert (first.best_epoch, first.stop_reason) == (2, "train.max_epochs 3 reached")
    resumed = fit(6, resume=True)
    assert resumed.epochs == 4  # epochs 3 and 4 without improvement
    assert resumed.stop_reason == "NDCG@10 did not improve for 2 epochs (early stop)"
    assert resumed.best_epoch == 2


def test_a_split_without_validation_users_is_refused_before_training(tmp_path: Path) -> None:
    """Every validation metric was NaN, no epoch the best, and model.pt the initial weights."""
    rows = [f"a{u},i{i},{t}" for u in range(5) for i, t in ((1, 1), (2, 2), (3, 1000))]
    rows += [f"b{u},i{u % 3 + 1},{t}" for u in range(20) for t in (5, 1000)]
    log = tmp_path / "gts.csv"
    log.write_text("user_id,item_id,ts\n" + "\n".join(rows) + "\n")
    data = {
        "dataset": "file",
        "path": str(log),
        "timestamp_column": "ts",
        "split": "global_temporal",
        "min_user_interactions": 1,
        "min_item_interactions": 1,
    }
    config = experiment_from_raw(tiny_raw(data=data))
    with pytest.raises(DataError, match="the global_temporal split leaves no validation user"):
        train_experiment(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_poprec_counts_every_training_target_whatever_max_seq_len(tmp_path: Path) -> None:
    """Its training batches once held each user's newest max_seq_len items only: on ML-1M
    (max_seq_len 50) it counted 27% of the targets, and popular items swapped ranks."""
    raw = {**tiny_raw(train={"max_epochs": 1}), "model": {"name": "pop", "max_seq_len": 3}}
    config = experiment_from_raw(raw)
    data = prepare(config.data)
    assert data.split.train.lengths.max() > 3 * 2  # histories far longer than max_seq_len
    model = build_model(build_model_config(config.model, num_items=data.num_items))
    Trainer(model, data, config).fit()
    train = data.split.train
    first = train.offsets[:-1][train.lengths > 0]  # every item but a sequence's first
    targets = np.delete(train.items, first)
    expected = np.bincount(targets, minlength=data.num_items + 1)
    np.testing.assert_array_equal(model.counts.numpy(), expected)
