"""Where a trained run's top 10 goes when the user's seen items are not filtered out.

For each run, over its test users (full ranking): NDCG@10 and HR@10 with the seen items ranked
(RecBole's protocol for sequential models) and filtered (the SASRec+ papers'), the share of
the unfiltered top-10 slots that hold an item of the user's history, and how often the first
is the history's last item. On data without repeats (ML-1M) every such slot is wasted.

    .venv/bin/python benchmarks/seen_items.py runs/acc-m4r/ml-1m_mamba4rec --data-dir ../shared/data
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from common import at_least, run_benchmark
from torch import Tensor

from seqrec.analysis.hooks import padded_batches
from seqrec.batch import PAD_ID
from seqrec.data.sequences import EvalSet
from seqrec.metrics import hit_rate, ndcg, rank_of_target
from seqrec.models.base import ScoringRecommender
from seqrec.training.checkpoint import load_run
from seqrec.training.run import data_for_run

K = 10


def seen_item_stats(model: ScoringRecommender, test: EvalSet) -> dict[str, float]:
    """NDCG@K and HR@K with seen items ranked and filtered, the share of the ranked top-K
    slots that hold a seen item, and the share of users whose first is their last item."""
    ranked, filtered, seen_slots, last_first = [], [], [], []
    histories = test.histories
    with torch.no_grad():
        for rows, input_ids in padded_batches(histories, model.config.max_seq_len, 256):
            scores = model.score(input_ids, torch.from_numpy(test.users[rows])).float()
            scores[:, PAD_ID] = float("-inf")
            targets = torch.from_numpy(test.targets[rows].astype(np.int64))
            ranked.append(rank_of_target(scores, targets))
            top = scores.topk(K, dim=1).indices
            sub = histories.take(rows)
            seen = torch.zeros_like(scores, dtype=torch.bool)
            seen[torch.from_numpy(sub.row_ids()), torch.from_numpy(sub.items.astype(np.int64))] = (
                True
            )
            seen_slots.append(seen.gather(1, top).float().mean(dim=1))
            last_first.append((top[:, 0] == input_ids[:, -1]).float())
            filtered.append(rank_of_target(scores.masked_fill(seen, float("-inf")), targets))
    r, f = torch.cat(ranked), torch.cat(filtered)
    return {
        "ndcg_ranked": _mean(ndcg(r, K)),
        "hr_ranked": _mean(hit_rate(r, K)),
        "ndcg_filtered": _mean(ndcg(f, K)),
        "hr_filtered": _mean(hit_rate(f, K)),
        "seen_slots": _mean(torch.cat(seen_slots)),
        "last_item_first": _mean(torch.cat(last_first)),
    }


def _mean(values: Tensor) -> float:
    return float(values.double().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run directories of scoring models")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--threads", type=at_least(1), default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        "| run | NDCG@10 / HR@10, seen ranked | NDCG@10 / HR@10, seen filtered "
        "| seen items in the top 10 | last item first |"
    )
    print("|---|---:|---:|---:|---:|")
    for run_dir in args.runs:
        run = load_run(run_dir)
        if not isinstance(run.model, ScoringRecommender):
            raise SystemExit(f"{run_dir}: not a scoring model")
        s = seen_item_stats(run.model, data_for_run(run, args.data_dir).eval_set("test"))
        print(
            f"| {run_dir} | {s['ndcg_ranked']:.4f} / {s['hr_ranked']:.4f} "
            f"| {s['ndcg_filtered']:.4f} / {s['hr_filtered']:.4f} "
            f"| {s['seen_slots']:.3f} | {s['last_item_first']:.3f} |"
        )


if __name__ == "__main__":
    run_benchmark(main)
