"""RecRec's training cost per stage: stage 1 (backbone + compressor, CE + IDR) against
stage 2 (the reasoner under deep supervision, K x T steps), timed on the same optimizer steps.

The issue's target is a stage-2 epoch at most 3x a stage-1 epoch. Both stages train the first
``--steps`` optimizer steps of epoch 1 (random batches of the shipped configs, each trained
in ``--parts`` length-sorted parts, as the runs of ``docs/results/recrec.md``), after
``--warmup`` untimed steps; stage 2 starts from the stage-1 model's weights. Seconds per step
are projected to an epoch. The FLOPs of the products (the matmuls, most of the arithmetic) of
one more step of each stage, on the same batch, show how much of the time ratio the arithmetic
alone sets.

    .venv/bin/python benchmarks/recrec_stages.py --data-dir ../shared/data
    .venv/bin/python benchmarks/recrec_stages.py --datasets beauty ml-1m --threads 2
    .venv/bin/python benchmarks/recrec_stages.py --datasets ml-1m --set train.precision=bf16
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

import torch
from common import at_least, run_benchmark
from torch.utils.flop_counter import FlopCounterMode

from seqrec.config import experiment_from_raw, load_raw
from seqrec.data.prepare import prepare
from seqrec.data.sequences import PreparedData
from seqrec.models import build_model, build_model_config
from seqrec.models.base import SequentialRecommender
from seqrec.nn.linear import ONEDNN_PRODUCT, product_flops
from seqrec.training.loop import Trainer, epoch_seeds

REPO = Path(__file__).resolve().parents[1]


def time_steps(
    model: SequentialRecommender, raw: dict[str, Any], data: PreparedData, steps: int, warmup: int
) -> tuple[float, int, int, int]:
    """(seconds per timed step, steps per epoch, targets in the timed steps, FLOPs of the
    products (matmuls) of the first timed step)."""
    config = experiment_from_raw(raw)  # a stage-2 model holds stage 1's weights (``measure``)
    trainer = Trainer(model, data, config)
    rng, seed = epoch_seeds(config.train.seed, 1)
    torch.manual_seed(seed)
    batches = trainer.batches.steps(rng)
    trainer.train_steps(itertools.islice(batches, warmup))
    timed = list(itertools.islice(batches, steps))
    stats = trainer.train_steps(timed)
    with FlopCounterMode(display=False, custom_mapping={ONEDNN_PRODUCT: product_flops}) as counter:
        trainer.train_steps(timed[:1])
    return (
        stats.seconds / len(timed),
        len(trainer.batches),
        stats.targets,
        counter.get_total_flops(),
    )


def measure(
    dataset: str,
    data_dir: str | None,
    steps: int,
    warmup: int,
    parts: int,
    overrides: list[str],
) -> dict[str, Any]:
    raws = {
        stage: load_raw(
            REPO / "configs" / f"{dataset}_recrec-stage{stage}.yaml",
            [f"train.batch_parts={parts}", "train.progress=false", "train.device=cpu", *overrides],
        )
        for stage in (1, 2)
    }
    data = prepare(experiment_from_raw(raws[1]).data, data_dir)  # the stages share their data
    row: dict[str, Any] = {"dataset": dataset, "threads": torch.get_num_threads(), "parts": parts}
    row["set"] = overrides
    stage_1_weights = None
    for stage, raw in raws.items():
        torch.manual_seed(0)
        model = build_model(build_model_config(raw["model"], num_items=data.num_items))
        if stage_1_weights is not None:
            missing = model.load_state_dict(stage_1_weights, strict=False).missing_keys
            assert all(key.startswith(("reasoner.", "gate.", "s0")) for key in missing), missing
        per_step, steps_per_epoch, targets, flops = time_steps(model, raw, data, steps, warmup)
        stage_1_weights = model.state_dict()
        row[f"stage{stage}_step_seconds"] = round(per_step, 3)
        row[f"stage{stage}_epoch_seconds"] = round(per_step * steps_per_epoch, 1)
        row[f"stage{stage}_step_gflop"] = round(flops / 1e9, 1)
        row["steps_per_epoch"] = steps_per_epoch
        row["timed_targets"] = targets
    row["ratio"] = round(row["stage2_step_seconds"] / row["stage1_step_seconds"], 2)
    row["flop_ratio"] = round(row["stage2_step_gflop"] / row["stage1_step_gflop"], 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["beauty"], choices=["beauty", "ml-1m"])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument(
        "--steps", type=at_least(1), default=30, help="timed optimizer steps per stage"
    )
    parser.add_argument("--warmup", type=at_least(0), default=2, help="untimed steps before them")
    parser.add_argument("--parts", type=at_least(1), default=8, help="train.batch_parts")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for both stages, e.g. train.precision=bf16 (repeatable)",
    )
    parser.add_argument("--threads", type=at_least(1), default=None, help="torch threads")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rows = [
        measure(dataset, args.data_dir, args.steps, args.warmup, args.parts, args.set)
        for dataset in args.datasets
    ]
    print(
        "| dataset | threads | stage 1 s/epoch | stage 2 s/epoch | stage 2 / stage 1 "
        "| GFLOP per step, stage 1 / stage 2 | FLOP ratio |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['dataset']} | {row['threads']} | {row['stage1_epoch_seconds']:.0f} "
            f"| {row['stage2_epoch_seconds']:.0f} | {row['ratio']:.2f} "
            f"| {row['stage1_step_gflop']:.0f} / {row['stage2_step_gflop']:.0f} "
            f"| {row['flop_ratio']:.2f} |"
        )
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    run_benchmark(main)
