"""What the accuracy benchmarks share: train a ready config to early stopping (resuming an
interrupted run), then evaluate its best model on test under the sampled and full protocols."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from seqrec.io import atomic_write_text

REPO = Path(__file__).resolve().parents[1]
PROTOCOLS = ("sampled", "full")


def run_benchmark(main: Callable[[], None]) -> None:
    """Run a benchmark's ``main``: bad input (a config, data or run directory it refuses, a
    value out of range) is one ``error:`` line and exit status 2, as with the seqrec CLI;
    ``SEQREC_DEBUG=1`` shows the traceback."""
    try:
        main()
    except (ValueError, KeyError, OSError) as err:  # ConfigError, DataError, RunDirError
        if os.environ.get("SEQREC_DEBUG"):
            raise
        sys.stderr.write(f"error: {err.args[0] if isinstance(err, KeyError) else err}\n")
        sys.exit(2)


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an int of at least ``minimum`` (argparse names the flag)."""

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = f"int >= {minimum}"
    return parse


def child_stdout(command: list[str], env: dict[str, str] | None = None) -> str:
    """The stdout of a measurement run in a process of its own; when it fails, its own last
    error line (not "returned non-zero exit status 1") as a ``ValueError``."""
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        last = lines[-1].removeprefix("error: ") if lines else f"exit status {done.returncode}"
        raise ValueError(f"a measurement failed: {last}")
    return done.stdout


def train_and_evaluate(
    name: str,
    out: Path,
    data_dir: str | None,
    overrides: list[str],
    filter_seen: bool | None = True,
) -> list[dict[str, Any]]:
    """Rows (one per protocol) for ``configs/<name>.yaml`` trained into ``out/<name>``.

    ``filter_seen`` None keeps the config's own policy, which a reproduction follows where the
    paper ranked seen items too (RecBole's sequential models)."""
    # here, not at the top: the measurement scripts import this module without torch
    from seqrec.config import experiment_from_raw, load_raw
    from seqrec.evaluation import evaluate_model
    from seqrec.training.run import train_experiment

    config = experiment_from_raw(load_raw(REPO / "configs" / f"{name}.yaml", overrides))
    run_dir = out / name
    outcome = train_experiment(config, run_dir, data_dir=data_dir, resume=True)
    history = outcome.fit.history
    best = next(row for row in history if row["epoch"] == outcome.fit.best_epoch)
    epoch_seconds = sorted(row["epoch_seconds"] for row in history)
    set_flags = "".join(f" --set {o}" for o in overrides if not o.startswith("train.progress"))
    data_flag = f" --data-dir {data_dir}" if data_dir else ""
    rows = []
    for protocol in PROTOCOLS:
        # The sampled protocol draws its negatives among unseen items: no policy to follow.
        filtered = protocol == "sampled" or (
            config.eval.filter_seen if filter_seen is None else filter_seen
        )
        eval_config = dataclasses.replace(config.eval, protocol=protocol, filter_seen=filtered)
        if eval_config == config.eval:
            result = outcome.test
        else:
            result = evaluate_model(outcome.model, outcome.data, eval_config)
        rows.append(
            {
                "experiment": name,
                "model": config.model.get("name", "sasrec"),
                "dataset": outcome.data.name,
                "protocol": protocol,
                "filter_seen": filtered,
                "HR@10": result.metrics["HR@10"],
                "NDCG@10": result.metrics["NDCG@10"],
                "NDCG@10_ci95": result.ci95["NDCG@10"],
                "epochs": outcome.fit.epochs,
                "best_epoch": outcome.fit.best_epoch,
                "seconds_to_best_epoch": best["elapsed_seconds"],
                "train_seconds": history[-1]["elapsed_seconds"],
                "median_epoch_seconds": epoch_seconds[len(epoch_seconds) // 2],
                "users": result.num_users,
                "command": (
                    f"seqrec train --config configs/{name}.yaml{set_flags} --out {run_dir}"
                    f"{data_flag} && seqrec evaluate {run_dir} --protocol {protocol} "
                    f"--{'' if filtered else 'no-'}filter-seen{data_flag}"
                ),
            }
        )
    return rows


def machine() -> dict[str, Any]:
    """What a timing was taken on. Machines of one nominal type (2 cores) have run this code
    twice as fast as each other, so every speed figure carries its CPU."""
    import torch

    info = _first_processor()
    cpu = info.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in info:
        cpu += f" (family {info['cpu family']}, model {info.get('model', '?')})"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _first_processor() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo; empty where there is none (not Linux)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def describe_machine(info: dict[str, Any]) -> str:
    return f"{info['cpu']}, {info['cores']} cores, torch {info['torch']}, {info['date']}"


def save_rows(rows: list[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(rows, indent=2) + "\n")
