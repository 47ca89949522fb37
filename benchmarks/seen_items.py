"""Where a trained run's top 10 goes when the user's seen items are not filtered out.

For each run, over its test users (full ranking): NDCG@10 and HR@10 with the seen items ranked
(RecBole's protocol for sequential models) and filtered (the SASRec+ papers'), the share of
the unfiltered top-10 slots that hold an item of the user's history, and how often the first
is the history's last item. On data without repeats (ML-1M) every such slot is wasted.

    .venv/bin/python benchmarks/seen_items.py runs/acc-m4r/ml-1m_mamba4rec --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
import torch

from seqrec.data.batches import left_padded
from seqrec.data.sequences import EvalSet
from seqrec.models.base import ScoringRecommender
from seqrec.training.checkpoint import load_run
from seqrec.training.run import data_for_run

K = 10


@dataclass
class SeenItemStats:
    users: int = 0
    ndcg_ranked: float = 0.0
    hits_ranked: int = 0
    ndcg_filtered: float = 0.0
    hits_filtered: int = 0
    seen_slots: int = 0
    last_item_first: int = 0

    def add_target(self, rank: int, filtered: bool) -> None:
        if rank >= K:
            return
        gain = 1.0 / float(np.log2(rank + 2))
        if filtered:
            self.hits_filtered += 1
            self.ndcg_filtered += gain
        else:
            self.hits_ranked += 1
            self.ndcg_ranked += gain


def seen_item_stats(
    model: ScoringRecommender, test: EvalSet, batch_size: int = 256
) -> SeenItemStats:
    stats = SeenItemStats(users=len(test))
    offsets, items = test.histories.offsets, test.histories.items
    with torch.no_grad():
        for start in range(0, len(test), batch_size):
            rows = np.arange(start, min(start + batch_size, len(test)))
            inputs = torch.from_numpy(left_padded(test.histories, rows, model.config.max_seq_len))
            scores = model.score(inputs, torch.from_numpy(test.users[rows])).float()
            scores[:, 0] = float("-inf")  # padding
            for b, row in enumerate(rows):
                history = torch.from_numpy(items[offsets[row] : offsets[row + 1]].astype(np.int64))
                ranked = scores[b]
                top = torch.topk(ranked, K).indices
                stats.seen_slots += int(torch.isin(top, history).sum())
                stats.last_item_first += int(top[0] == history[-1])
                target = int(test.targets[row])
                stats.add_target(int((ranked > ranked[target]).sum()), filtered=False)
                filtered = ranked.clone()
                filtered[history] = float("-inf")
                stats.add_target(int((filtered > filtered[target]).sum()), filtered=True)
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run directories of scoring models")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--threads", type=int, default=1)
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
        n = s.users
        print(
            f"| {run_dir} | {s.ndcg_ranked / n:.4f} / {s.hits_ranked / n:.4f} "
            f"| {s.ndcg_filtered / n:.4f} / {s.hits_filtered / n:.4f} "
            f"| {s.seen_slots / (K * n):.3f} | {s.last_item_first / n:.3f} |"
        )


if __name__ == "__main__":
    main()
