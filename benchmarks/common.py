"""What the accuracy benchmarks share: train a ready config to early stopping (resuming an
interrupted run), then evaluate its best model on test under the sampled and full protocols."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
from pathlib import Path
from typing import Any

from seqrec.config import experiment_from_raw, load_raw
from seqrec.evaluation import evaluate_model
from seqrec.io import atomic_write_text
from seqrec.training.run import train_experiment

REPO = Path(__file__).resolve().parents[1]
PROTOCOLS = ("sampled", "full")


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
    config = experiment_from_raw(load_raw(REPO / "configs" / f"{name}.yaml", overrides))
    run_dir = out / name
    outcome = train_experiment(config, run_dir, data_dir=data_dir, resume=True)
    history = outcome.fit.history
    best = next(row for row in history if row["epoch"] == outcome.fit.best_epoch)
    epoch_seconds = sorted(row["epoch_seconds"] for row in history)
    set_flags = "".join(f" --set {o}" for o in overrides if not o.startswith("train.progress"))
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
                    f"seqrec train --config configs/{name}.yaml{set_flags} --out {run_dir} && "
                    f"seqrec evaluate {run_dir} --protocol {protocol} "
                    f"--{'' if filtered else 'no-'}filter-seen"
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
