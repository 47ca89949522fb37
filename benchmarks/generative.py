"""Generative recommendation benchmark: RQ tokenizer -> TIGER and TrieRec, beside SASRec+CE
and PopRec under the same protocol, with the beam search's decoding throughput.

Protocol (TIGER/TrieRec papers): 5-core, the last 20 interactions per user, leave-one-out,
the whole catalogue ranked (beam search of width 10 for the generative models, filter-seen),
Recall@K and NDCG@K for K = 5, 10. Every model trains under the same wall-clock budget
(``train.time_budget_minutes``), early stopping on validation NDCG@10 within it.

``--size cpu`` (default) is the reduced configuration for a 2-core CPU: 2+2 layers, d 64,
4 heads of 16, FFN 256; ``--size paper`` keeps the configs' paper sizes (4+4, d 128, 6 x 64,
FFN 1024). TIGER and TrieRec share one set of semantic IDs per dataset, fitted first.

Decoding: the trained TIGER ranks the same test users twice, with the batched trie-constrained
beam search (``recommend``) and with the per-user, per-beam reference
(``recommend_reference``); the script checks they return the same items and prints users per
second for both.

    python benchmarks/generative.py --data-dir ../shared/data                  # Beauty + ML-1M
    python benchmarks/generative.py --data-dir ../shared/data --quick          # smoke, minutes
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import REPO, at_least, machine, run_benchmark, save_rows

from seqrec.config import experiment_from_raw, load_raw
from seqrec.data.batches import left_padded
from seqrec.data.prepare import prepare
from seqrec.models.tiger import TIGER
from seqrec.tokenizers import SemanticIds, format_report
from seqrec.training.checkpoint import load_run
from seqrec.training.run import train_experiment
from seqrec.training.semantic_ids import SEMANTIC_IDS, RunSemanticIds, fit_semantic_ids

DATASETS = {"beauty": "amazon-beauty", "ml-1m": "ml-1m"}
PROTOCOL = ["data.max_history=20", "eval.ks=[5,10]", "eval.protocol=full", "eval.filter_seen=true"]
CPU_SIZE = [
    "model.hidden_size=64",
    "model.num_heads=4",
    "model.head_size=16",
    "model.ffn_size=256",
    "model.num_encoder_layers=2",
    "model.num_decoder_layers=2",
]
METRICS = ("Recall@5", "Recall@10", "NDCG@5", "NDCG@10")


def train_row(
    config_name: str, label: str, out: Path, overrides: list[str], data_dir: str | None
) -> dict[str, Any]:
    config = experiment_from_raw(load_raw(REPO / "configs" / f"{config_name}.yaml", overrides))
    run_dir = out / label
    outcome = train_experiment(config, run_dir, data_dir=data_dir, resume=True)
    history = outcome.fit.history
    return {
        "model": label,
        "dataset": outcome.data.name,
        **{name: outcome.test.metrics[name] for name in METRICS},
        "NDCG@10_ci95": outcome.test.ci95["NDCG@10"],
        "epochs": outcome.fit.epochs,
        "best_epoch": outcome.fit.best_epoch,
        "train_seconds": history[-1]["elapsed_seconds"] if history else 0.0,
        "run_dir": str(run_dir),
        "command": f"seqrec train --config configs/{config_name}.yaml "
        + " ".join(f"--set {o}" for o in overrides)
        + f" --out {run_dir}"
        + (f" --data-dir {data_dir}" if data_dir else ""),
    }


def decoding_throughput(
    run_dir: Path, dataset: str, data_dir: str | None, users: int, reference_users: int
) -> dict[str, Any]:
    """Users per second of the batched beam search and of the per-user reference."""
    run = load_run(run_dir)
    model = run.model
    assert isinstance(model, TIGER)
    data = prepare(run.config.data, data_dir)
    test = data.split.test
    rows = np.arange(min(users, len(test)))
    input_ids = torch.from_numpy(
        left_padded(test.histories, rows, model.config.max_seq_len)
    )  # (users, L)
    user_ids = torch.from_numpy(test.users[rows].astype(np.int64))
    model.recommend(input_ids[:8], 10, users=user_ids[:8])  # warm-up
    start = time.perf_counter()
    fast = model.recommend(input_ids, 10, users=user_ids)
    fast_seconds = time.perf_counter() - start
    sub = slice(0, min(reference_users, len(rows)))
    start = time.perf_counter()
    slow = model.recommend_reference(input_ids[sub], 10, users=user_ids[sub])
    slow_seconds = time.perf_counter() - start
    fast_rate = len(rows) / fast_seconds
    slow_rate = len(slow) / slow_seconds
    return {
        "dataset": dataset,
        "users": len(rows),
        "beam_size": model.config.beam_size,
        "batched_users_per_second": round(fast_rate, 1),
        "reference_users": len(slow),
        "reference_users_per_second": round(slow_rate, 2),
        "speedup": round(fast_rate / slow_rate, 1),
        "same_items": bool(torch.equal(fast[sub], slow)),
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    header = f"{'dataset':<14} {'model':<9}" + "".join(f"{m:>11}" for m in METRICS)
    print(header + f"{'epochs':>8}{'train s':>9}")
    for row in rows:
        print(
            f"{row['dataset']:<14} {row['model']:<9}"
            + "".join(f"{row[m]:>11.4f}" for m in METRICS)
            + f"{row['epochs']:>8}{row['train_seconds']:>9.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", choices=sorted(DATASETS), default=list(DATASETS))
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", default="runs/generative")
    parser.add_argument("--budget-minutes", type=float, default=60.0, help="per model")
    parser.add_argument("--size", choices=["cpu", "paper"], default="cpu")
    parser.add_argument("--tokenizer", choices=["rqkmeans", "rqvae"], default="rqkmeans")
    parser.add_argument("--threads", type=at_least(1), default=None, help="torch threads per run")
    parser.add_argument("--decode-users", type=at_least(1), default=256)
    parser.add_argument("--reference-users", type=at_least(1), default=256)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="Beauty only, 3-minute budgets, 64 and 16 decoded users (replacing those flags)",
    )
    args = parser.parse_args()
    if not args.budget_minutes > 0:
        parser.error(f"argument --budget-minutes: must be > 0, got {args.budget_minutes}")
    if args.quick:
        args.datasets, args.budget_minutes = ["beauty"], 3.0
        args.decode_users, args.reference_users = 64, 16
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    common = [
        *PROTOCOL,
        f"train.time_budget_minutes={args.budget_minutes}",
        "train.progress=false",
        *([f"train.num_threads={args.threads}"] if args.threads else []),
    ]
    size = CPU_SIZE if args.size == "cpu" else []
    rows: list[dict[str, Any]] = []
    decoding: list[dict[str, Any]] = []
    for short in args.datasets:
        folder = out / short / SEMANTIC_IDS
        if not (folder / "semantic_ids.json").is_file():
            config = experiment_from_raw(
                load_raw(
                    REPO / "configs" / f"{short}_tiger.yaml",
                    [*PROTOCOL, f"tokenizer.method={args.tokenizer}"],
                )
            )
            data = prepare(config.data, args.data_dir)
            ids, tokenizer = fit_semantic_ids(config.tokenizer, data, args.data_dir)
            RunSemanticIds(ids, tokenizer, loaded_from=None).save(out / short)
        print(f"semantic IDs for {short} ({args.tokenizer}):")
        print(format_report(SemanticIds.load(folder).report()))
        generative = [*common, *size, f"tokenizer.from_run={folder}"]
        for model in ("tiger", "trierec"):
            rows.append(
                train_row(f"{short}_{model}", model, out / short, generative, args.data_dir)
            )
        rows.append(
            train_row(f"{short}_sasrec-ce", "sasrec-ce", out / short, common, args.data_dir)
        )
        rows.append(train_row(f"{short}_pop", "pop", out / short, common, args.data_dir))
        decoding.append(
            decoding_throughput(
                out / short / "tiger",
                short,
                args.data_dir,
                args.decode_users,
                args.reference_users,
            )
        )
    print_table(rows)
    print("\ndecoding (TIGER, beam 10, top 10):")
    for row in decoding:
        print(
            f"{row['dataset']:<8} batched {row['batched_users_per_second']:>8.1f} users/s over "
            f"{row['users']} users; per-user reference {row['reference_users_per_second']:>6.2f} "
            f"users/s over {row['reference_users']}; speedup {row['speedup']}x; "
            f"same items: {row['same_items']}"
        )
    hardware = {
        **machine(),
        "architecture": platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }
    print(
        f"\nhardware: {json.dumps(hardware)}; size: {args.size}; budget {args.budget_minutes} min"
    )
    if args.quick:
        print("--quick: 3-minute budgets are a smoke run, not the benchmark's result")
    save_rows(
        [
            *rows,
            *decoding,
            {"hardware": hardware, "size": args.size, "budget": args.budget_minutes},
        ],
        out / f"results-{'-'.join(args.datasets)}.json",
    )


if __name__ == "__main__":
    run_benchmark(main)
