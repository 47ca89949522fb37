"""DuoRec's contrastive views in a trained run: is the InfoNCE above, at or below chance, and
are the newest hidden states spread out or collapsed onto one direction?

For a few training batches built as DuoRec trains (each user's newest training position, a
same-target sequence as its supervised view), prints per run: the InfoNCE of the two views
(the run's temperature and similarity, same-target rows masked; chance is ln(2B - 1)), the
mean cosine between a row's two views and between two different rows' views, and the mean
norm of the newest state, with dropout off ("eval") and on ("train").

    .venv/bin/python benchmarks/duorec_views.py runs/beauty_duorec runs/duorec-prefixes \
        --data-dir ../shared/data

Any SASRec-family run works (an untrained DuoRec term is computed with DuoRec's defaults):
a SASRec+CE run shows where the next-item loss alone puts the views.
"""

from __future__ import annotations

import argparse
import dataclasses
import math

import numpy as np
import torch
import torch.nn.functional as F
from common import at_least, run_benchmark

from seqrec.batch import SeqBatch
from seqrec.data.batches import TrainBatches
from seqrec.models.duorec import DuoRecConfig, info_nce
from seqrec.models.sasrec import SASRec
from seqrec.training.checkpoint import load_run
from seqrec.training.run import data_for_run


def view_statistics(
    model: SASRec, batches: list[SeqBatch], temperature: float, similarity: str
) -> dict[str, float]:
    nce, same, other, norm = [], [], [], []
    with torch.no_grad():
        for batch in batches:
            assert batch.same_target_ids is not None
            assert batch.labels is not None
            first = model.newest_state(batch.input_ids)
            second = model.newest_state(batch.same_target_ids)
            loss = info_nce(
                first,
                second,
                temperature=temperature,
                similarity=similarity,  # type: ignore[arg-type]
                targets=batch.labels[:, -1],
            )
            nce.append(float(loss))
            a, b = F.normalize(first, dim=-1), F.normalize(second, dim=-1)
            same.append(float((a * b).sum(-1).mean()))
            other.append(float((a * b.roll(1, dims=0)).sum(-1).mean()))
            norm.append(float(first.norm(dim=-1).mean()))
    return {
        "InfoNCE": float(np.mean(nce)),
        "cos same target": float(np.mean(same)),
        "cos other row": float(np.mean(other)),
        "norm": float(np.mean(norm)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run directories of SASRec-family models")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--batch-size", type=at_least(1), default=256)
    parser.add_argument("--batches", type=at_least(1), default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    defaults = DuoRecConfig(num_items=1, num_users=1)
    chance = math.log(2 * args.batch_size - 1)
    print(f"InfoNCE at chance: ln({2 * args.batch_size - 1}) = {chance:.3f}")
    print("| run | dropout | InfoNCE | cos same target | cos other row | norm |")
    print("|---|---|---:|---:|---:|---:|")
    for run_dir in args.runs:
        run = load_run(run_dir)
        if not isinstance(run.model, SASRec):
            raise SystemExit(f"{run_dir}: {type(run.model).__name__} is not a SASRec-family model")
        model = run.model
        config = model.config
        temperature = getattr(config, "temperature", defaults.temperature)
        similarity = getattr(config, "similarity", defaults.similarity)
        data = data_for_run(run, args.data_dir)
        needs = dataclasses.replace(
            model.batch_needs, same_target_sequences=True, prefix_examples=False
        )
        source = TrainBatches(
            sequences=data.split.train,
            users=data.split.train_users,
            num_items=data.num_items,
            max_seq_len=config.max_seq_len,
            batch_size=args.batch_size,
            needs=needs,
        )
        batches = []
        for batch in source.epoch(np.random.default_rng(args.seed)):
            if len(batches) == args.batches:
                break
            batches.append(batch)
        for mode in ("eval", "train"):
            model.train(mode == "train")
            torch.manual_seed(args.seed)
            stats = view_statistics(model, batches, temperature, similarity)
            cells = " | ".join(f"{value:.3f}" for value in stats.values())
            print(f"| {run_dir} | {mode} | {cells} |")


if __name__ == "__main__":
    run_benchmark(main)
