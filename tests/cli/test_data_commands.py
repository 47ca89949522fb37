"""``seqrec data list|info|prepare`` and ``--help``, run in-process through ``main``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from seqrec import __version__
from seqrec.cli import main
from seqrec.data.synthetic import generate
from tests.tiny import REQUIRED_DATASETS

DATASETS = REQUIRED_DATASETS
SMALL = ["--set", "data.synthetic_users=300", "--set", "data.synthetic_items=200"]
NO_KCORE = ["--set", "data.min_user_interactions=1", "--set", "data.min_item_interactions=1"]


def test_data_list_names_every_dataset(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "list"]) == 0
    first_words = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert first_words == DATASETS

    assert main(["data", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["name"] for row in rows] == DATASETS
    assert all(row["description"] and row["citation"] for row in rows)


def test_data_info_synthetic_matches_the_generated_log(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "info", "synthetic", "--json", *SMALL, *NO_KCORE]) == 0
    info = json.loads(capsys.readouterr().out)

    log = generate(300, 200, seed=0)  # the defaults of data.synthetic_seed
    lengths = log.group_by("user_id").len()["len"].to_numpy()
    users, items, interactions = 300, log["item_id"].n_unique(), log.height
    assert info["dataset"] == "synthetic"
    assert (info["users"], info["items"], info["interactions"]) == (users, items, interactions)
    assert info["mean_length"] == pytest.approx(interactions / users, abs=0.005)
    assert info["median_length"] == float(np.median(lengths))
    pairs = log.unique(["user_id", "item_id"]).height  # synthetic users repeat items
    assert info["density"] == pytest.approx(pairs / (users * items))
    # leave-one-out: every user has >= 5 items, so all are evaluated and lose 2 to train
    assert info["split"] == "leave_one_out"
    assert info["valid_users"] == info["test_users"] == info["train_users"] == users
    assert info["train_interactions"] == interactions - 2 * users


def test_data_info_text_shows_every_statistic(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "info", "synthetic", *SMALL]) == 0
    out = capsys.readouterr().out
    shown = dict(line.split(maxsplit=1) for line in out.splitlines())
    for key in (
        "users",
        "items",
        "interactions",
        "mean_length",
        "median_length",
        "density",
        "train_users",
        "train_interactions",
        "valid_users",
        "test_users",
    ):
        assert key in shown, out
    assert shown["users"] == "300"
    assert shown["split"] == "leave_one_out"


def test_data_prepare_caches_unless_no_cache(capsys: pytest.CaptureFixture[str]) -> None:
    cache = Path(os.environ["SEQREC_CACHE_DIR"])
    assert main(["data", "prepare", "synthetic", *SMALL, "--no-cache"]) == 0
    assert "interactions" in capsys.readouterr().out
    assert not (cache / "prepared").exists()

    assert main(["data", "prepare", "synthetic", *SMALL]) == 0
    printed = capsys.readouterr().out
    (entry,) = (cache / "prepared").iterdir()
    assert entry.name.startswith("synthetic-")
    assert {p.name for p in entry.iterdir()} >= {"data.npz", "idmap.json", "meta.json"}
    assert main(["data", "info", "synthetic", *SMALL]) == 0  # now served from the cache
    assert capsys.readouterr().out.strip() == printed.strip()


def test_data_prepare_reads_the_config_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = tmp_path / "clicks.csv"
    rows = [("a", "x", 1), ("a", "y", 2), ("a", "z", 3), ("b", "y", 1), ("b", "x", 5)]
    pl.DataFrame(rows, schema=["user_id", "item_id", "ts"], orient="row").write_csv(log)
    config = tmp_path / "c.yaml"
    config.write_text(
        f"data: {{dataset: file, path: {log}, timestamp_column: ts,"
        " min_user_interactions: 1, min_item_interactions: 1}\n"
    )
    assert main(["data", "prepare", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "clicks.csv" in out
    shown = dict(line.split(maxsplit=1) for line in out.splitlines())
    assert shown["interactions"] == "5"
    assert shown["users"] == "2"


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["data"],
        ["data", "list"],
        ["data", "info"],
        ["data", "prepare"],
        ["train"],
        ["evaluate"],
        ["recommend"],
        ["demo"],
    ],
    ids=lambda c: " ".join(c) or "seqrec",
)
def test_help_exits_zero(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="^0$"):
        main([*command, "--help"])
    out = capsys.readouterr().out
    assert out.startswith(f"usage: seqrec {' '.join(command)}".rstrip())


def test_help_version_and_data_list_do_not_import_torch() -> None:
    """They answer in a fraction of a second; importing torch alone takes over one."""
    code = (
        "import sys; from seqrec.cli import main\n"
        "for argv in (['data', 'list'], ['--version']):\n"
        "    try: main(argv)\n"
        "    except SystemExit: pass\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("name ")
    assert f"seqrec {__version__}" in done.stdout
