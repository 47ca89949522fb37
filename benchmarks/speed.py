r"""SASRec training and evaluation speed on ML-1M with the shipped configs, on this machine:
``bce`` is configs/ml-1m_sasrec.yaml (the paper's settings), ``ce`` configs/ml-1m_sasrec-ce.yaml
(SASRec+); ``ce3000`` (configs/ml-1m_sasrec-ce-3000.yaml, SASRec+ 3000) and ``mamba``
(configs/ml-1m_mamba4rec.yaml, Mamba4Rec) on request.

An epoch is one pass over every user's training sequence with the loss on every position
(the SASRec paper's definition). Each variant runs in its own process so that its peak memory
(max RSS) is its own. Prints a table and one JSON line per variant and batching: random
batches (the default, as the reference code trains), random batches trained in length-sorted
parts (``train.batch_parts``; the same steps and gradients, less padding) and length-bucketed
batches (less padding, different batches). Beside the wall time of an epoch it reports the
process's CPU time (user + system, all threads): on a machine shared with other jobs that one
moves less with their load, so compare code versions by it there.

    .venv/bin/python benchmarks/speed.py --data-dir ../shared/data
    .venv/bin/python benchmarks/speed.py --variants bce --batching random --parts 1 4 --threads 2
    .venv/bin/python benchmarks/speed.py --epochs 0 --batching random --parts 1 \
        --eval-batch-size 1024

``--epochs 0`` measures the evaluation only (of the untrained model: the time does not depend
on the weights); ``--eval-batch-size`` sets the users per evaluation chunk (default: the
evaluator's own choice, ``eval.batch_size``).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

from common import at_least, child_stdout, describe_machine, machine, run_benchmark

from seqrec.io import standard_json

REPO = Path(__file__).resolve().parents[1]
# The model sections of the shipped configs: the paper's ML-1M settings (BCE, one negative),
# SASRec+ (full softmax CE) and SASRec+ 3000 (softmax over 3,000 shared negatives).
VARIANTS = {
    "bce": "ml-1m_sasrec",
    "ce": "ml-1m_sasrec-ce",
    "ce3000": "ml-1m_sasrec-ce-3000",
    "mamba": "ml-1m_mamba4rec",
}
BATCHING = ("random", "length_buckets")  # train.batching


def median_after_warmup(per_epoch: list[float]) -> float:
    """The median over the epochs after the first (which warms up); nan without any."""
    import numpy as np

    timed = per_epoch[1:] if len(per_epoch) > 1 else per_epoch
    return float(np.median(timed)) if timed else float("nan")


def measure(
    variant: str,
    batching: str,
    parts: int,
    epochs: int,
    data_dir: str | None,
    threads: int | None,
    batch_size: int | None = None,
    eval_batch_size: int | None = None,
) -> dict[str, Any]:
    import torch

    from seqrec.config import DataConfig, EvalConfig, experiment_from_raw, load_raw
    from seqrec.data.prepare import prepare
    from seqrec.evaluation import evaluate_model
    from seqrec.models import build_model, build_model_config
    from seqrec.training.loop import Trainer

    if threads is not None:
        torch.set_num_threads(threads)
    data = prepare(DataConfig(dataset="ml-1m"), data_dir)
    shipped = load_raw(REPO / "configs" / f"{VARIANTS[variant]}.yaml")
    torch.manual_seed(0)
    model = build_model(build_model_config(shipped["model"], num_items=data.num_items))
    train = {**shipped["train"], "batching": batching, "batch_parts": parts}
    if batch_size is not None:
        train["batch_size"] = batch_size
    train |= {"progress": False, "device": "cpu"}
    config = experiment_from_raw({"train": train})
    trainer = Trainer(model, data, config)
    from seqrec.training.loop import epoch_seeds, train_one_epoch

    seconds, cpu_seconds, targets = [], [], 0
    for epoch in range(1, epochs + 1):
        rng, seed = epoch_seeds(0, epoch)
        torch.manual_seed(seed)
        cpu_start = time.process_time()
        stats = train_one_epoch(
            model, trainer.batches.steps(rng), trainer.optimizer, device=trainer.device
        )
        cpu_seconds.append(time.process_time() - cpu_start)
        seconds.append(stats.seconds)
        targets = stats.targets
    epoch_seconds = median_after_warmup(seconds)
    evaluation = {}
    for protocol in ("full", "sampled"):
        eval_config = EvalConfig(protocol=protocol, batch_size=eval_batch_size)
        evaluate_model(model, data, eval_config)  # warm-up
        start = time.perf_counter()
        result = evaluate_model(model, data, eval_config)
        evaluation[protocol] = (time.perf_counter() - start, result.num_users)
    return {
        "variant": variant,
        "batching": batching,
        "batch_parts": parts,
        "batch_size": trainer.config.train.batch_size,
        "threads": torch.get_num_threads(),
        "epoch_seconds": epoch_seconds,
        "epoch_seconds_all": [round(s, 2) for s in seconds],
        "epoch_cpu_seconds": median_after_warmup(cpu_seconds),
        "targets_per_epoch": targets,
        "targets_per_second": targets / epoch_seconds,  # nan without a timed epoch
        "eval_batch_size": eval_batch_size,
        "eval_full_seconds": evaluation["full"][0],
        "eval_sampled_seconds": evaluation["sampled"][0],
        "eval_users": evaluation["full"][1],
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=["bce", "ce"], choices=list(VARIANTS))
    parser.add_argument("--batching", nargs="+", default=list(BATCHING), choices=list(BATCHING))
    parser.add_argument(
        "--parts",
        type=at_least(1),
        nargs="+",
        default=[1, 4],
        help="train.batch_parts values measured with random batches",
    )
    parser.add_argument(
        "--epochs",
        type=at_least(0),
        default=3,
        help="epochs per variant (1st is warm-up; 0: evaluation only)",
    )
    parser.add_argument(
        "--eval-batch-size", type=at_least(1), default=None, help="users per evaluation chunk"
    )
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--threads", type=at_least(1), default=None)
    parser.add_argument(
        "--batch-size",
        type=at_least(1),
        default=None,
        help="users per batch (default: each config's)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        batching, parts = args.batching[0], args.parts[0]
        row = measure(
            args.child, batching, parts, args.epochs, args.data_dir, args.threads,
            args.batch_size, args.eval_batch_size,
        )  # fmt: skip
        print(json.dumps(row))
        return
    rows = []
    on = machine()
    modes = [
        (batching, parts)
        for batching in args.batching
        for parts in (args.parts if batching == "random" else [1])
    ]
    for variant in args.variants:
        for batching, parts in modes:
            command = [sys.executable, __file__, "--child", variant, "--batching", batching]
            command += ["--parts", str(parts), "--epochs", str(args.epochs)]
            if args.data_dir:
                command += ["--data-dir", args.data_dir]
            if args.threads:
                command += ["--threads", str(args.threads)]
            if args.batch_size:
                command += ["--batch-size", str(args.batch_size)]
            if args.eval_batch_size:
                command += ["--eval-batch-size", str(args.eval_batch_size)]
            out = child_stdout(command)
            rows.append({**json.loads(out.strip().splitlines()[-1]), "machine": on})
            print(json.dumps(standard_json(rows[-1])), flush=True)  # NaN: null
    print(
        "\nML-1M, "
        + ", ".join(f"{name}: configs/{VARIANTS[name]}.yaml" for name in args.variants)
        + f", {rows[0]['threads']} threads, users per evaluation chunk: "
        + (str(args.eval_batch_size) if args.eval_batch_size else "the evaluator's default")
        + f"\non {describe_machine(on)}"
    )
    print(
        f"{'config':<6} {'batching':<15} {'batch':>5} {'parts':>5} {'s/epoch':>8} "
        f"{'CPU s/epoch':>12} {'targets/s':>10} {'eval full s':>12} {'eval sampled s':>15} "
        f"{'peak GiB':>9}"
    )
    for r in rows:
        print(
            f"{r['variant']:<6} {r['batching']:<15} {r['batch_size']:>5} {r['batch_parts']:>5} "
            f"{r['epoch_seconds']:>8.2f} {r['epoch_cpu_seconds']:>12.2f} "
            f"{r['targets_per_second']:>10,.0f} "
            f"{r['eval_full_seconds']:>12.2f} {r['eval_sampled_seconds']:>15.2f} "
            f"{r['peak_rss_gib']:>9.2f}"
        )


if __name__ == "__main__":
    run_benchmark(main)
