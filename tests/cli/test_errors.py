"""Bad input: one clear ``error:`` line on stderr, a non-zero exit, no traceback, no files."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import polars as pl
import pytest

import seqrec.cli as cli_module
import seqrec.nn.selective_scan as selective_scan_module
from seqrec.cli import main
from seqrec.training.checkpoint import STATE
from tests.cli.helpers import one_error_line, run_seqrec, tiny_raw, write_yaml


def error_of(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> str:
    """Run ``main``; it must exit 2 with nothing on stdout and one error line, returned."""
    code = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.out == ""
    return one_error_line(captured.err)


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture
def run_copy(file_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(file_run, tmp_path / "run"))


# ---------------------------------------------------------------- config and data errors
@pytest.mark.parametrize(
    ("raw", "overrides", "pattern"),
    [
        (
            tiny_raw(train={"learning_rate": 0.1}),
            [],
            r"unknown key\(s\) train\.learning_rate; valid train keys: .*\blr\b.*max_epochs",
        ),
        (
            tiny_raw(),
            ["train.optimizer=sgd"],
            r"train\.optimizer: 'sgd' is not one of 'adam', 'adamw'$",
        ),
        (
            tiny_raw(),
            ["data.split=random"],
            r"data\.split: 'random' is not one of 'leave_one_out', 'global_temporal'$",
        ),
        (tiny_raw(model={"name": "transformer"}), [], r"unknown model 'transformer'; available: "),
        (
            tiny_raw(data={"dataset": "movielens"}),
            [],
            r"unknown dataset 'movielens'; known: ml-1m, ml-100k, amazon-beauty, amazon-sports, "
            r"amazon-toys, amazon-video-games, yelp, lastfm, steam, synthetic",
        ),
        (
            tiny_raw(),
            ["data.min_user_interactions=100000"],
            r"preprocessing step 'k_core' removed every interaction "
            r"\(data\.min_user_interactions=100000",
        ),
    ],
    ids=["unknown-key", "literal", "literal-split", "model", "dataset", "k-core"],
)
def test_bad_config_is_one_line_and_creates_no_run(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    raw: dict[str, dict[str, object]],
    overrides: list[str],
    pattern: str,
) -> None:
    config = write_yaml(tmp_path / "c.yaml", raw)
    sets = [arg for override in overrides for arg in ("--set", override)]
    line = error_of(capsys, "train", "--config", config, "--out", tmp_path / "run", *sets)
    assert re.search(pattern, line), line
    assert not (tmp_path / "run").exists()


def test_a_diverged_training_is_one_line_that_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was an "unexpected FloatingPointError", exit 1, asking for SEQREC_DEBUG."""
    config = write_yaml(tmp_path / "c.yaml", tiny_raw(train={"lr": 1e6}, model={"loss": "ce"}))
    line = error_of(capsys, "train", "--config", config, "--out", tmp_path / "run")
    assert line == "error: training loss is not finite; lower train.lr or check the data"


def test_data_with_no_training_target_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every user with 3 items: leave-one-out leaves one item a user to train on, no target.
    Training on that once 'succeeded' with loss 0 and perfect validation metrics."""
    log = tmp_path / "three.csv"
    log.write_text(
        "user_id,item_id\n" + "".join(f"u{u},i{u % 4 + j}\n" for u in range(9) for j in range(3))
    )
    data = {
        "dataset": "file",
        "path": str(log),
        "min_user_interactions": 1,
        "min_item_interactions": 1,
    }
    config = write_yaml(tmp_path / "c.yaml", tiny_raw(data=data))
    line = error_of(capsys, "train", "--config", config, "--out", tmp_path / "run")
    assert "nothing to train on: no training sequence has 2 items" in line
    assert "a user needs 4 or more" in line
    assert not (tmp_path / "run").exists()


def test_unknown_model_lists_the_available_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_yaml(tmp_path / "c.yaml", tiny_raw(model={"name": "transformer"}))
    line = error_of(capsys, "train", "--config", config, "--out", tmp_path / "run")
    available = line.split("available: ")[1].split(", ")
    assert {"pop", "sasrec"} <= set(available)


def test_data_info_of_an_unknown_dataset(capsys: pytest.CaptureFixture[str]) -> None:
    line = error_of(capsys, "data", "info", "movielens")
    assert "unknown dataset 'movielens'; known: ml-1m" in line
    assert "synthetic" in line


@pytest.mark.parametrize(
    ("name", "text", "extra", "pattern"),
    [
        (
            "log.txt",
            "u1 i1\nu1 i2\nu2 i1\nu2 i1 i3\nu3 i2\n",
            {"format": "pairs"},
            r"log\.txt:4: malformed line 'u2 i1 i3'; expected `user item`",
        ),
        (
            "log.csv",
            "user_id,item_id,timestamp\nu1,i1,1\nu1,i2,2\nu2,i1,3\nu2,i3\n",
            {"timestamp_column": "timestamp"},
            r"log\.csv:5: malformed line; expected 3 fields",
        ),
        (
            "ratings.dat",
            "1::10::5::100\n1::11::4::101\n2::10::five::102\n",
            {},
            r"ratings\.dat:3: malformed line '2::10::five::102'",
        ),
    ],
    ids=["pairs", "csv", "movielens"],
)
def test_malformed_interaction_file_names_the_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    text: str,
    extra: dict[str, str],
    pattern: str,
) -> None:
    path = tmp_path / name
    path.write_text(text)
    raw = tiny_raw(data={"dataset": "file", "path": str(path), **extra})
    config = write_yaml(tmp_path / "c.yaml", raw)
    line = error_of(capsys, "train", "--config", config, "--out", tmp_path / "run")
    assert re.search(pattern, line), line
    assert not (tmp_path / "run").exists()

    line = error_of(capsys, "data", "prepare", "--config", config)
    assert re.search(pattern, line), line


def test_train_refuses_an_existing_run_without_resume(
    run_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = digest(run_copy)
    config = write_yaml(tmp_path / "c.yaml", tiny_raw())
    line = error_of(capsys, "train", "--config", config, "--out", run_copy)
    assert "already holds a run; pass --resume" in line
    assert digest(run_copy) == before


def test_a_run_that_never_completed_an_epoch_is_named_as_such(
    run_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stub = tmp_path / "stub"  # what an interrupted first epoch, or an older seqrec, leaves
    stub.mkdir()
    for name in ("config.json", "id_map.json"):
        shutil.copy(run_copy / name, stub / name)
    before = digest(stub)
    config = write_yaml(tmp_path / "c.yaml", tiny_raw())
    line = error_of(capsys, "train", "--config", config, "--out", stub)
    assert "holds a run that never completed an epoch (config.json, no checkpoint.pt)" in line
    assert "pass --resume to start it from epoch 1" in line
    changed = ("--set", "model.hidden_size=8", "--resume")
    line = error_of(capsys, "train", "--config", config, "--out", stub, *changed)
    assert "the config differs" in line
    assert "never completed an epoch: removing it loses nothing" in line
    assert digest(stub) == before
    line = error_of(capsys, "train", "--config", config, "--out", run_copy, *changed)
    assert "the config differs" in line
    assert "removing it" not in line  # a trained run is never called disposable


def test_bad_monitor_leaves_no_partial_run_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_yaml(tmp_path / "c.yaml", tiny_raw(train={"monitor": "NDCG@50"}))
    line = error_of(capsys, "train", "--config", config, "--out", tmp_path / "run")
    assert "train.monitor 'NDCG@50' is not a computed metric; valid: HR@5" in line
    assert not (tmp_path / "run").exists()


def test_more_sampled_negatives_than_items_is_refused_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = tiny_raw(eval={"protocol": "sampled", "num_negatives": 5000})
    config = write_yaml(tmp_path / "c.yaml", raw)
    line = error_of(capsys, "train", "--config", config, "--out", tmp_path / "run")
    match = re.fullmatch(
        r"error: eval\.num_negatives=5000 is more than the catalogue of (\d+) items holds "
        r"besides the target; the largest value that works is (\d+)",
        line,
    )
    assert match, line
    assert int(match[2]) == int(match[1]) - 1
    assert not (tmp_path / "run").exists()


def test_evaluate_refuses_more_sampled_negatives_than_items_before_reading_data(
    run_copy: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_data(*args: object, **kwargs: object) -> None:
        raise AssertionError("the data was read before the protocol was checked")

    monkeypatch.setattr("seqrec.training.run.data_for_run", no_data)
    config = json.loads((run_copy / "config.json").read_text())
    config["eval"]["num_negatives"] = 100_000  # fine under the full protocol it trained with
    (run_copy / "config.json").write_text(json.dumps(config))
    num_items = config["model"]["num_items"]
    line = error_of(capsys, "evaluate", run_copy, "--protocol", "sampled")
    assert line == (
        f"error: eval.num_negatives=100000 is more than the catalogue of {num_items} items "
        f"holds besides the target; the largest value that works is {num_items - 1}"
    )


@pytest.mark.parametrize(
    ("model", "pattern"),
    [
        ({"name": "sasrek"}, r"unknown model 'sasrek'; available: "),
        ({"name": "sasrec", "hiden_size": 8}, r"unknown key\(s\) model\.hiden_size; valid model"),
        ({"name": "mamba4rec", "loss": "bce"}, r"unknown key\(s\) model\.loss; valid model"),
        ({"name": "gsasrec", "loss": "ce"}, r"model 'gsasrec' cannot use loss 'ce'; it supports"),
    ],
    ids=["name", "key", "loss-key", "loss"],
)
def test_model_section_is_checked_before_the_data_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model: dict[str, object], pattern: str
) -> None:
    raw = tiny_raw(data={"dataset": "file", "path": str(tmp_path / "absent.csv")}, model=model)
    config = write_yaml(tmp_path / "c.yaml", raw)
    line = error_of(capsys, "train", "--config", config, "--out", tmp_path / "run")
    assert re.search(pattern, line), line
    assert not (tmp_path / "run").exists()


def test_an_unusable_scan_is_refused_before_the_data_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It used to surface at the first batch, after the data, as an 'unexpected' error."""
    monkeypatch.setattr(selective_scan_module, "_mamba_kernel", lambda: None)
    raw = tiny_raw(
        data={"dataset": "file", "path": str(tmp_path / "absent.csv")},
        model={"name": "mamba4rec", "scan": "cuda"},
        train={"device": "cpu"},
    )
    config = write_yaml(tmp_path / "c.yaml", raw)
    line = error_of(capsys, "train", "--config", config, "--out", tmp_path / "run")
    # on this CPU machine the kernel is refused for its device before its package is asked for
    assert line == (
        "error: model.scan 'cuda' runs on cuda tensors, and this model is on cpu: use "
        "model.scan auto (or set train.device cuda)"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("model", ["tiger", "trierec"])
def test_sampled_validation_of_a_generative_model_is_refused_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str
) -> None:
    """It used to fail after the semantic IDs were fitted and the first epoch trained."""
    raw = tiny_raw(
        data={"dataset": "file", "path": str(tmp_path / "absent.csv")},
        model={"name": model},
        eval={"protocol": "sampled"},
    )
    config = write_yaml(tmp_path / "c.yaml", raw)
    line = error_of(capsys, "train", "--config", config, "--out", tmp_path / "run")
    assert line == (
        f"error: eval.protocol: sampled ranks candidates by score; {model} only returns a "
        "top-k list, so validate it with eval.protocol: full"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("checkpointed", [False, True])
def test_an_interrupted_train_suggests_resume_only_when_there_is_a_checkpoint(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    checkpointed: bool,
) -> None:
    """Stopped during data preparation it once said "a training run resumes with --resume",
    with no run directory to resume."""
    out = tmp_path / "run"
    if checkpointed:
        out.mkdir()
        (out / STATE).write_bytes(b"")

    def stopped(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_module, "cmd_train", stopped)
    config = write_yaml(tmp_path / "c.yaml", tiny_raw())
    assert main(["train", "--config", str(config), "--out", str(out)]) == 130
    resume = "; a training run resumes with --resume" if checkpointed else ""
    assert capsys.readouterr().err == f"interrupted{resume}\n"


def test_a_run_whose_log_moved_evaluates_with_data_dir(
    run_copy: Path, file_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It once said only "data.path ... does not exist", and nothing could point the run at
    the log's new place but editing config.json."""
    config = json.loads((run_copy / "config.json").read_text())
    trained_on = Path(config["data"]["path"])
    config["data"]["path"] = str(tmp_path / "old" / trained_on.name)  # where it was
    (run_copy / "config.json").write_text(json.dumps(config))
    line = error_of(capsys, "evaluate", run_copy)
    assert line == (
        f"error: {tmp_path / 'old' / trained_on.name}, the file this run was trained on, does "
        f"not exist; if it moved, pass --data-dir with the folder that now holds {trained_on.name}"
    )
    moved = tmp_path / "new"
    moved.mkdir()
    line = error_of(capsys, "evaluate", run_copy, "--data-dir", moved)
    assert line.endswith(f"nor does {moved / trained_on.name} (--data-dir)")
    shutil.copy(trained_on, moved / trained_on.name)
    assert main(["evaluate", str(run_copy), "--data-dir", str(moved), "--json"]) == 0
    at_new_place = json.loads(capsys.readouterr().out)
    assert main(["evaluate", str(file_run), "--json"]) == 0
    original = json.loads(capsys.readouterr().out)
    assert at_new_place == original
    # a log still in its place is read there, whatever --data-dir says
    assert (
        main(["evaluate", str(file_run), "--data-dir", str(tmp_path / "elsewhere"), "--json"]) == 0
    )
    assert json.loads(capsys.readouterr().out) == original


# ---------------------------------------------------------------- run directory errors
@pytest.mark.parametrize("command", ["evaluate", "recommend"])
def test_missing_run_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    extra = ["--history", "i1"] if command == "recommend" else []
    line = error_of(capsys, command, tmp_path / "nowhere", *extra)
    assert re.search(r"run directory .*nowhere does not exist", line), line


def truncate(path: Path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.parametrize("command", ["evaluate", "recommend"])
@pytest.mark.parametrize(
    ("damage", "pattern"),
    [
        pytest.param(
            lambda run: truncate(run / "model.pt", 0.5),
            r"model\.pt is corrupt or not a seqrec file",
            id="model-truncated",
        ),
        pytest.param(
            lambda run: truncate(run / "model.pt", 0.0),
            r"model\.pt is corrupt or not a seqrec file",
            id="model-empty",
        ),
        pytest.param(
            lambda run: (run / "model.pt").write_text("not a checkpoint"),
            r"model\.pt is corrupt or not a seqrec file \(unpickling: Unsupported operand 110\)$",
            id="model-text",
        ),
        pytest.param(
            lambda run: (run / "model.pt").unlink(), r"model\.pt is missing", id="model-missing"
        ),
        pytest.param(  # what Ctrl-C before the first epoch's end leaves
            lambda run: [(run / name).unlink() for name in ("model.pt", "checkpoint.pt")],
            r"never completed an epoch \(no model\.pt, no checkpoint\.pt: stopped before its "
            r"first epoch ended\): seqrec train --out .* --resume trains it$",
            id="stub",
        ),
        pytest.param(
            lambda run: truncate(run / "config.json", 0.5),
            r"config\.json is corrupt",
            id="config-truncated",
        ),
        pytest.param(
            lambda run: (run / "config.json").write_text("[]"),
            r"config\.json is not a seqrec config",
            id="config-not-a-mapping",
        ),
        pytest.param(
            lambda run: (run / "config.json").unlink(),
            r"not a seqrec run directory \(no config\.json\)",
            id="config-missing",
        ),
        pytest.param(
            lambda run: truncate(run / "id_map.json", 0.5),
            r"id_map\.json is corrupt \(invalid JSON: .*\): re-train or restore it$",
            id="idmap-truncated",
        ),
    ],
)
def test_damaged_run_directory(
    run_copy: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    damage: object,
    pattern: str,
) -> None:
    damage(run_copy)  # type: ignore[operator]
    extra = ["--history", "i1", "i2"] if command == "recommend" else []
    line = error_of(capsys, command, run_copy, *extra)
    assert re.search(pattern, line), line
    # torch's weights-only refusal advises weights_only=False: never for a damaged file
    assert "weights_only" not in line, line


def set_id_map(run: Path, content: object) -> None:
    (run / "id_map.json").write_text(json.dumps(content))


@pytest.mark.parametrize(
    ("damage", "detail"),
    [
        pytest.param(lambda run: truncate(run / "id_map.json", 0.5), "invalid JSON: ", id="cut"),
        pytest.param(
            lambda run: (run / "id_map.json").write_bytes(b'{"users": ["\xff"], "items": []}'),
            "not UTF-8: invalid start byte at byte 12",
            id="not-utf8",
        ),
        pytest.param(
            lambda run: set_id_map(run, ["u1", "i1"]),
            'not an object with "users" and "items"',
            id="a-list",
        ),
        pytest.param(
            lambda run: set_id_map(run, {"users": "u1u2", "items": ["i1"]}),
            '"users" is a str, not a list',
            id="users-a-string",
        ),
        pytest.param(
            lambda run: set_id_map(run, {"users": ["u1"], "items": ["i1", None]}),
            '"items" holds null, not an id',
            id="null-item",
        ),
        pytest.param(
            lambda run: set_id_map(
                run, {**json.loads((run / "id_map.json").read_text()), "items": ["i1", "i2"]}
            ),
            "2 items, the model in config.json has ",
            id="item-count",
        ),
        pytest.param(
            lambda run: set_id_map(
                run, {**json.loads((run / "id_map.json").read_text()), "users": ["u1"]}
            ),
            "1 users, the model in config.json has ",
            id="user-count",
        ),
    ],
)
@pytest.mark.parametrize("command", ["evaluate", "recommend", "serve"])
def test_corrupt_id_map_names_the_file_for_every_command(
    run_copy: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    damage: object,
    detail: str,
) -> None:
    damage(run_copy)  # type: ignore[operator]
    path = run_copy / "id_map.json"
    if command == "serve":  # serve loads through the Predictor before it binds a port
        from seqrec.serving.predictor import Predictor
        from seqrec.training.checkpoint import RunDirError

        with pytest.raises(RunDirError) as caught:
            Predictor.from_run_dir(run_copy)
        line = f"error: {caught.value}"
    else:
        extra = ["--history", "i1", "i2"] if command == "recommend" else []
        line = error_of(capsys, command, run_copy, *extra)
    assert line.startswith(f"error: {path} is corrupt ("), line
    assert detail in line
    assert line.endswith("): re-train or restore it")


def test_missing_id_map_says_so(run_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (run_copy / "id_map.json").unlink()
    line = error_of(capsys, "evaluate", run_copy)
    assert line == f"error: {run_copy / 'id_map.json'} is missing: re-train or restore it"


def test_model_weights_of_another_shape_are_one_line(
    run_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    state = torch.load(run_copy / "model.pt", weights_only=True)
    state = {name: torch.cat([value, value]) for name, value in state.items()}
    torch.save(state, run_copy / "model.pt")
    line = error_of(capsys, "evaluate", run_copy)
    assert "model.pt does not fit the model in config.json" in line


# ---------------------------------------------------------------- evaluate / recommend flags
def test_export_ranks_refuses_other_suffixes(
    file_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "ranks.txt"
    line = error_of(capsys, "evaluate", file_run, "--export-ranks", target)
    assert "--export-ranks: use a .csv or .parquet file" in line
    assert list(tmp_path.iterdir()) == []


def write_other_parquet(path: Path) -> None:
    pl.DataFrame({"user_id": ["u1"], "item_id": ["i1"]}).write_parquet(path)


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("data.csv", lambda path: path.write_text("user_id,item_id,timestamp\nu1,i1,1\n")),
        ("ranks.csv", lambda path: path.write_text("user_id,target,rank,note\nu1,i1,1,x\n")),
        ("empty.csv", lambda path: path.write_bytes(b"")),
        ("data.parquet", write_other_parquet),
        ("text.parquet", lambda path: path.write_text("user_id,target,rank\n")),
    ],
    ids=["data-csv", "extra-column", "empty", "other-parquet", "not-parquet"],
)
def test_export_ranks_refuses_an_unrelated_file_before_evaluating(
    file_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    make: object,
) -> None:
    def no_evaluation(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run was evaluated before the output was checked")

    monkeypatch.setattr("seqrec.training.run.evaluate_run", no_evaluation)
    target = tmp_path / name
    make(target)  # type: ignore[operator]
    before = target.read_bytes()
    line = error_of(capsys, "evaluate", file_run, "--export-ranks", target)
    assert line == (
        f"error: --export-ranks: {target} exists and is not a rank file written by seqrec "
        "evaluate; remove it or choose another path"
    )
    assert target.read_bytes() == before


def test_export_ranks_refuses_the_dataset_and_the_run_files(
    file_run: Path,
    log_csv: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_evaluation(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run was evaluated before the output was checked")

    monkeypatch.setattr("seqrec.training.run.evaluate_run", no_evaluation)  # the log is shared
    before = {path: path.read_bytes() for path in (log_csv, file_run / "results.json")}
    line = error_of(capsys, "evaluate", file_run, "--export-ranks", log_csv)
    assert f"--export-ranks: {log_csv} exists and is not a rank file" in line
    line = error_of(capsys, "evaluate", file_run, "--export-ranks", file_run / "results.json")
    assert "--export-ranks: use a .csv or .parquet file" in line
    assert {path: path.read_bytes() for path in before} == before


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_export_ranks_replaces_an_earlier_export(
    file_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], suffix: str
) -> None:
    target = tmp_path / f"ranks{suffix}"
    assert main(["evaluate", str(file_run), "--export-ranks", str(target)]) == 0
    first = pl.read_csv(target) if suffix == ".csv" else pl.read_parquet(target)
    argv = ["evaluate", str(file_run), "--split", "valid", "--export-ranks", str(target)]
    assert main(argv) == 0
    capsys.readouterr()
    again = pl.read_csv(target) if suffix == ".csv" else pl.read_parquet(target)
    assert again.columns == first.columns == ["user_id", "target", "rank", "protocol"]
    assert not again.equals(first)  # the valid split's targets replaced the test split's
    old = first.select("user_id", "target", "rank")  # a file written before the protocol column
    if suffix == ".csv":
        old.write_csv(target)
    else:
        old.write_parquet(target)
    assert main(argv) == 0  # is a rank file too, and replaced
    assert "protocol" in (pl.read_csv(target) if suffix == ".csv" else pl.read_parquet(target))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--history", "i1", "-k", "0"], "k must be >= 1, got 0"),
        (["--input", "in.txt"], "recommend: --input needs --output FILE"),
        ([], "recommend: give either --history ITEM ... or --input FILE --output FILE"),
    ],
    ids=["k0", "no-output", "nothing"],
)
def test_bad_recommend_arguments(
    file_run: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert error_of(capsys, "recommend", file_run, *args) == f"error: {message}"


# ---------------------------------------------------------------- the real executable
def test_subprocess_errors_exit_2_with_one_line(file_run: Path, tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "c.yaml", tiny_raw(train={"learning_rate": 0.1}))
    done = run_seqrec("train", "--config", config, "--out", tmp_path / "run")
    assert done.returncode == 2
    assert "unknown key(s) train.learning_rate" in one_error_line(done.stderr)
    assert done.stdout == ""
    assert not (tmp_path / "run").exists()

    broken = Path(shutil.copytree(file_run, tmp_path / "broken"))
    truncate(broken / "model.pt", 0.3)
    done = run_seqrec("evaluate", broken, "--json")
    assert done.returncode == 2
    assert "model.pt is corrupt" in one_error_line(done.stderr)
    assert done.stdout == ""


# ---------------------------------------------------------------- output locations, checked first
@pytest.mark.parametrize(
    "command",
    [
        ["train", "--config", "CONFIG"],
        ["tokenize", "--config", "CONFIG"],
        ["analyze", "residual", "RUN"],
        ["analyze", "attention", "RUN"],
        ["analyze", "depth", "RUN"],
        ["demo"],
    ],
    ids=["train", "tokenize", "residual", "attention", "depth", "demo"],
)
def test_out_that_is_a_file_is_refused_and_kept(
    file_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    config = write_yaml(tmp_path / "c.yaml", tiny_raw())
    precious = tmp_path / "precious.csv"
    precious.write_text("a,b\n1,2\n")
    argv = [{"CONFIG": str(config), "RUN": str(file_run)}.get(arg, arg) for arg in command]
    line = error_of(capsys, *argv, "--out", precious)
    assert line == f"error: --out {precious}: is a file, not a directory"
    assert precious.read_text() == "a,b\n1,2\n"


def test_semantic_ids_are_not_written_into_a_run_directory(
    file_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A generative run's own semantic_ids.json would be replaced by codes it never saw."""
    config = write_yaml(tmp_path / "c.yaml", tiny_raw())
    before = {path.name: path.read_bytes() for path in file_run.iterdir() if path.is_file()}
    line = error_of(capsys, "tokenize", "--config", config, "--out", file_run)
    assert line == (
        f"error: --out {file_run} is a run directory; write the semantic IDs to a folder of "
        f"its own, e.g. {file_run / 'out'}"
    )
    after = {path.name: path.read_bytes() for path in file_run.iterdir() if path.is_file()}
    assert after == before


def test_semantic_ids_are_not_written_into_a_folder_of_a_run(
    file_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its semantic_ids/ was replaced by codes the trained model never saw."""
    config = write_yaml(tmp_path / "c.yaml", tiny_raw())
    inside = file_run / "semantic_ids"
    line = error_of(capsys, "tokenize", "--config", config, "--out", inside)
    assert line.startswith(f"error: --out {inside} is inside the run directory {file_run}")
    assert not inside.exists()


def test_tokenize_refuses_from_run_which_it_would_not_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It fitted anew with the other settings while a warning said they changed nothing."""
    config = write_yaml(tmp_path / "c.yaml", tiny_raw(tokenizer={"from_run": str(tmp_path)}))
    line = error_of(capsys, "tokenize", "--config", config, "--out", tmp_path / "ids")
    assert line.startswith("error: tokenizer.from_run reuses semantic IDs fitted before")
    assert not (tmp_path / "ids").exists()


@pytest.mark.parametrize("epochs", ["-1", "0"])
def test_demo_epochs_below_one_names_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, epochs: str
) -> None:
    def no_dataset(*args: object, **kwargs: object) -> None:
        raise AssertionError("the demo looked for its dataset before checking --epochs")

    monkeypatch.setattr("seqrec.demo.resolve_default_dataset", no_dataset)
    out = tmp_path / "demo"
    line = error_of(capsys, "demo", "--out", out, "--epochs", epochs)
    assert line == f"error: --epochs must be >= 1, got {epochs}"
    assert list(tmp_path.iterdir()) == []


def test_run_demo_refuses_epochs_below_one_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from seqrec.config import ConfigError
    from seqrec.demo import run_demo

    def no_dataset(*args: object, **kwargs: object) -> None:
        raise AssertionError("the demo looked for its dataset before checking epochs")

    monkeypatch.setattr("seqrec.demo.resolve_default_dataset", no_dataset)
    with pytest.raises(ConfigError, match=r"^--epochs must be >= 1, got -1$"):
        run_demo(tmp_path / "demo", epochs=-1)
    assert list(tmp_path.iterdir()) == []


def test_export_ranks_location_is_checked_before_evaluating(
    file_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_evaluation(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run was evaluated before the output was checked")

    monkeypatch.setattr("seqrec.training.run.evaluate_run", no_evaluation)
    folder = tmp_path / "ranks.csv"
    folder.mkdir()
    line = error_of(capsys, "evaluate", file_run, "--export-ranks", folder)
    assert line == f"error: --export-ranks {folder}: is a directory, not a file"

    plain = tmp_path / "plain.txt"
    plain.write_text("")
    line = error_of(capsys, "evaluate", file_run, "--export-ranks", plain / "ranks.csv")
    assert line == f"error: --export-ranks {plain / 'ranks.csv'}: {plain} is not a directory"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_export_ranks_into_an_unwritable_folder(
    file_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = error_of(capsys, "evaluate", file_run, "--export-ranks", "/proc/ranks.csv")
    assert line == "error: --export-ranks /proc/ranks.csv: /proc is not writable"


# ---------------------------------------------------------------- files of the wrong kind
@pytest.mark.parametrize(
    ("command", "extra"),
    [(["evaluate"], []), (["recommend"], ["--history", "i1"]), (["analyze", "depth"], ["--out"])],
    ids=["evaluate", "recommend", "depth"],
)
def test_a_file_given_as_run_directory(
    file_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: list[str],
    extra: list[str],
) -> None:
    weights = file_run / "model.pt"
    out = [tmp_path / "out"] if extra == ["--out"] else []
    line = error_of(capsys, *command, weights, *extra, *out)
    assert line == f"error: {weights} is a file, not a run directory; did you mean {file_run}?"


def test_compare_with_a_directory_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ranks = tmp_path / "a.csv"
    ranks.write_text("user_id,target,rank\nu1,i1,1\n")
    line = error_of(capsys, "compare", ranks, tmp_path)
    assert line == f"error: {tmp_path} is a directory, not a rank file"


def test_train_takes_set_settings_without_a_config_but_not_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = error_of(capsys, "train", "--out", tmp_path / "bare")
    assert "train needs --config FILE, or --set section.key=value settings" in line
    assert not (tmp_path / "bare").exists()
    raw = tiny_raw()
    raw["model"] = {"name": "pop"}
    sets = [
        f"{section}.{key}={json.dumps(value)}"
        for section, values in raw.items()
        for key, value in values.items()
    ]
    args = [arg for setting in sets for arg in ("--set", setting)]
    assert main(["train", "--out", str(tmp_path / "run"), *args]) == 0
    assert "trained pop: " in capsys.readouterr().out
