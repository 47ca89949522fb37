"""Shared helpers for the CLI and training tests: tiny configs, subprocess runs, error checks."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import torch
import yaml

from seqrec.config import SYNTHETIC_FIELDS, experiment_from_raw
from seqrec.data.synthetic import generate
from seqrec.training.run import train_experiment
from tests.env import isolate

# The console script installed next to the interpreter that runs the tests (.venv/bin/seqrec).
SEQREC = Path(sys.executable).with_name("seqrec")

# Small enough for a training run of a few epochs to take about a second on one core.
TINY: dict[str, dict[str, Any]] = {
    "data": {"dataset": "synthetic", "synthetic_users": 300, "synthetic_items": 200},
    "model": {"name": "sasrec", "hidden_size": 16, "max_seq_len": 20},
    "train": {"max_epochs": 3, "seed": 1, "progress": False, "num_threads": 1},
}


def tiny_raw(**sections: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``TINY`` with some keys of some sections replaced, e.g. ``tiny_raw(train={"lr": 0.01})``;
    another dataset drops the synthetic one's settings."""
    raw = copy.deepcopy(TINY)
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    if raw["data"]["dataset"] != "synthetic":  # the generator's settings would be refused
        for key in SYNTHETIC_FIELDS:
            raw["data"].pop(key, None)
    return raw


def write_yaml(path: Path, raw: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(raw))
    return path


def train_isolated(raw: dict[str, dict[str, Any]], run_dir: Path, cache_dir: Path) -> Path:
    """Train ``raw`` into ``run_dir`` with the library, isolated; torch threads restored."""
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, cache_dir)
        train_experiment(experiment_from_raw(raw), run_dir)
    torch.set_num_threads(threads)
    return run_dir


# TIGER small enough for a few epochs in seconds (its semantic IDs come from the tokenizer section)
TINY_TIGER = {
    "name": "tiger",
    "hidden_size": 16,
    "num_heads": 2,
    "head_size": 8,
    "ffn_size": 32,
    "num_encoder_layers": 1,
    "num_decoder_layers": 1,
    "user_buckets": 10,
    "max_seq_len": 10,
}


def tiger_raw(sasrec_run: Path, **model: Any) -> dict[str, dict[str, Any]]:
    """TINY_TIGER (``model`` changes applied) on RQ-KMeans semantic IDs of the item
    embeddings of a trained run (synthetic items have no text)."""
    return tiny_raw(
        model={**TINY_TIGER, **model},
        train={"max_epochs": 2, "batch_size": 256},
        eval={"ks": [5, 10]},
        tokenizer={
            "method": "rqkmeans",
            "num_levels": 2,
            "codebook_size": 8,
            "embeddings": "collaborative",
            "collaborative_run": str(sasrec_run),
        },
    )


RECREC = {"name": "recrec", "hidden_size": 16, "max_seq_len": 20, "num_interests": 4}
RECREC_STAGE_2 = {"stage": 2, "rounds": 2, "steps_per_round": 2, "inner_steps": 1}


def train_recrec_stage_2(root: Path) -> Path:
    """A tiny RecRec trained one epoch per stage (seconds), stage 2 from stage 1, in ``root``:
    a run whose inference depth is a setting."""
    stage_1 = train_isolated(
        tiny_raw(model=RECREC, train={"max_epochs": 1}), root / "stage1", root / "cache"
    )
    raw = tiny_raw(
        model={**RECREC, **RECREC_STAGE_2}, train={"max_epochs": 1, "init_from": str(stage_1)}
    )
    return train_isolated(raw, root / "stage2", root / "cache")


def cli_env() -> dict[str, str]:
    """The current (test-isolated) environment, for a subprocess: offline, temporary cache."""
    env = dict(os.environ)
    assert env.get("SEQREC_OFFLINE") == "1", "the isolation fixture must run first"
    assert env.get("SEQREC_CACHE_DIR"), "the isolation fixture must run first"
    env.pop("SEQREC_DEBUG", None)
    env.pop("SEQREC_DATA_DIR", None)
    return env


def run_seqrec(
    *args: str | Path, cwd: Path | None = None, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``seqrec ARGS`` in a subprocess; its exit code, stdout and stderr."""
    assert SEQREC.is_file(), f"the seqrec console script is not installed at {SEQREC}"
    return subprocess.run(
        [str(SEQREC), *map(str, args)],
        cwd=cwd,
        env={**cli_env(), **(extra_env or {})},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def one_error_line(stderr: str) -> str:
    """The CLI's error contract: exactly one non-empty stderr line, ``error: ...``, no traceback."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one error line on stderr, got {len(lines)}:\n{stderr}"
    assert lines[0].startswith("error: "), stderr
    return lines[0]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def losses(run_dir: Path) -> list[float]:
    return [row["loss"] for row in read_jsonl(run_dir / "metrics.jsonl")]


def without_timings(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """metrics.jsonl rows minus the wall-clock fields, which differ between runs."""
    timing = {"epoch_seconds", "targets_per_second", "elapsed_seconds"}
    return [{k: v for k, v in row.items() if k not in timing} for row in rows]


def assert_rows_close(a: list[dict[str, Any]], b: list[dict[str, Any]], tol: float = 1e-6) -> None:
    """Equal epochs and keys; every number within ``tol``."""
    a, b = without_timings(a), without_timings(b)
    assert [row["epoch"] for row in a] == [row["epoch"] for row in b]
    for row_a, row_b in zip(a, b, strict=True):
        assert row_a.keys() == row_b.keys()
        for key in row_a:
            assert abs(row_a[key] - row_b[key]) <= tol, (
                row_a["epoch"],
                key,
                row_a[key],
                row_b[key],
            )


def prefixed_log(num_users: int, num_items: int, seed: int) -> pl.DataFrame:
    """Synthetic interactions with ids "u<n>" / "i<n>": no original id looks like an internal."""
    df = generate(num_users, num_items, seed)
    return df.with_columns(
        pl.format("u{}", pl.col("user_id")).alias("user_id"),
        pl.format("i{}", pl.col("item_id")).alias("item_id"),
    )
