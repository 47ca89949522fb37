"""Bad input: one clear ``error:`` line on stderr, a non-zero exit, no traceback, no files."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

import pytest

from seqrec.cli import main
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
    del raw["data"]["synthetic_users"], raw["data"]["synthetic_items"]
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


def test_bad_monitor_leaves_no_partial_run_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_yaml(tmp_path / "c.yaml", tiny_raw(train={"monitor": "NDCG@50"}))
    line = error_of(capsys, "train", "--config", config, "--out", tmp_path / "run")
    assert "train.monitor 'NDCG@50' is not a computed metric; valid: HR@5" in line
    assert not (tmp_path / "run").exists()


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
    del raw["data"]["synthetic_users"], raw["data"]["synthetic_items"]
    config = write_yaml(tmp_path / "c.yaml", raw)
    line = error_of(capsys, "train", "--config", config, "--out", tmp_path / "run")
    assert re.search(pattern, line), line
    assert not (tmp_path / "run").exists()


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
            r"model\.pt is corrupt or not a seqrec file",
            id="model-text",
        ),
        pytest.param(
            lambda run: (run / "model.pt").unlink(), r"model\.pt is missing", id="model-missing"
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
            r"cannot read id map .*id_map\.json",
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
