"""The SASRec paper's Table III on our data: every baseline and SASRec, trained to early
stopping with its ready config (configs/<dataset>_<model>.yaml), evaluated on test under the
paper's sampled protocol (target + 100 never-seen items) and under full ranking.

Prints three Markdown tables -- sampled (Table III layout), full ranking, training time --
and writes every row to <out>/baselines.json, beside the rows of earlier runs with other
models. Run directories are resumed, so an interrupted benchmark continues where it stopped;
a run that finished is only re-evaluated.

    .venv/bin/python benchmarks/baselines.py --data-dir ../shared/data            # hours
    .venv/bin/python benchmarks/baselines.py --data-dir ../shared/data --quick    # smoke

``--quick`` trains every model on Beauty only for 2 epochs: a check that everything trains
and evaluates end to end on real data, not a reproduction.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from common import REPO, at_least, run_benchmark, save_rows, train_and_evaluate

DATASETS = {"beauty": "Beauty", "video-games": "Games", "ml-1m": "ML-1M"}  # Table III order
TABLE_III = ["pop", "bpr", "fmc", "fpmc", "transrec", "gru4rec", "gru4rec-plus", "caser"]
EXTRA = ["fism", "bert4rec", "duorec", "gsasrec", "sasrec-ce", "mamba4rec"]
SASREC = "sasrec"

# The SASRec paper's own row of Table III (anchors.md §1.1, verified): HR@10, NDCG@10.
PUBLISHED_SASREC = {
    "beauty": (0.4854, 0.3219),
    "video-games": (0.7410, 0.5360),
    "ml-1m": (0.8245, 0.5905),
}


def cell(rows: dict[tuple[str, str], dict[str, Any]], model: str, dataset: str) -> str:
    row = rows.get((model, dataset))
    if row is None:
        return "– | –"
    return f"{row['HR@10']:.4f} | {row['NDCG@10']:.4f}"


def with_earlier_rows(rows: list[dict[str, Any]], path: Path) -> list[dict[str, Any]]:
    """``rows`` plus the rows of ``path`` for (experiment, protocol) pairs not among them, so
    that runs of the benchmark with different ``--models`` add up instead of replacing each
    other's results."""
    if not path.is_file():
        return rows
    ours = {(row["experiment"], row["protocol"]) for row in rows}
    earlier = json.loads(path.read_text())
    return [row for row in earlier if (row["experiment"], row["protocol"]) not in ours] + rows


def metric_table(
    rows: list[dict[str, Any]], protocol: str, models: list[str], datasets: list[str]
) -> str:
    by_key = {(r["model_key"], r["dataset_key"]): r for r in rows if r["protocol"] == protocol}
    head = " | ".join(f"{DATASETS[d]} HR@10 | {DATASETS[d]} NDCG@10" for d in datasets)
    lines = [f"| model | {head} |", "|---|" + "---:|" * (2 * len(datasets))]
    lines += [f"| {m} | " + " | ".join(cell(by_key, m, d) for d in datasets) + " |" for m in models]
    if protocol == "sampled":
        published = " | ".join(
            f"{PUBLISHED_SASREC[d][0]:.4f} | {PUBLISHED_SASREC[d][1]:.4f}" for d in datasets
        )
        lines.append(f"| sasrec (paper) | {published} |")
    return "\n".join(lines)


def finding(rows: list[dict[str, Any]], protocol: str, datasets: list[str]) -> str:
    """Does SASRec beat every Table III baseline, per dataset and metric?"""
    out = []
    for d in datasets:
        ours = {
            r["model_key"]: r for r in rows if r["dataset_key"] == d and r["protocol"] == protocol
        }
        if SASREC not in ours:
            continue
        for metric in ("HR@10", "NDCG@10"):
            rivals = {m: ours[m][metric] for m in TABLE_III if m in ours}
            if not rivals:
                continue
            best = max(rivals, key=rivals.__getitem__)
            gain = ours[SASREC][metric] / rivals[best] - 1 if rivals[best] > 0 else float("inf")
            verdict = "holds" if gain > 0 else "DOES NOT hold"
            out.append(
                f"- {DATASETS[d]} {metric}: SASRec {ours[SASREC][metric]:.4f} vs best baseline "
                f"{best} {rivals[best]:.4f} ({gain:+.1%}): the finding {verdict}"
            )
    return "\n".join(out)


def time_table(rows: list[dict[str, Any]], models: list[str], datasets: list[str]) -> str:
    by_key = {(r["model_key"], r["dataset_key"]): r for r in rows if r["protocol"] == "full"}
    head = " | ".join(
        f"{DATASETS[d]} s/epoch | {DATASETS[d]} epochs (best) | {DATASETS[d]} total"
        for d in datasets
    )
    lines = [f"| model | {head} |", "|---|" + "---:|" * (3 * len(datasets))]
    for m in models:
        cells = []
        for d in datasets:
            r = by_key.get((m, d))
            cells.append(
                "– | – | –"
                if r is None
                else f"{r['median_epoch_seconds']:.1f} | {r['epochs']} ({r['best_epoch']}) | "
                f"{r['train_seconds'] / 60:.1f} min"
            )
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    models = [*TABLE_III, SASREC, *EXTRA]
    parser.add_argument("--models", nargs="+", default=models, choices=models)
    parser.add_argument("--out", default="runs/baselines", help="parent of the run directories")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--quick", action="store_true", help="Beauty only, 2 epochs per model")
    parser.add_argument("--max-epochs", type=at_least(1), default=None, help="cap epochs")
    parser.add_argument("--set", action="append", default=[], help="override a config key")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    datasets: list[str] = ["beauty"] if args.quick else args.datasets
    max_epochs = 2 if args.quick and args.max_epochs is None else args.max_epochs
    overrides = [*args.set, "train.progress=False"]
    if max_epochs is not None:
        overrides += [f"train.max_epochs={max_epochs}", f"train.patience={max_epochs}"]
    out = Path(args.out) / ("quick" if args.quick else "")
    rows: list[dict[str, Any]] = []
    for dataset in datasets:
        for model in args.models:
            name = f"{dataset}_{model}"
            if not (REPO / "configs" / f"{name}.yaml").is_file():
                logging.warning("no config configs/%s.yaml; skipped", name)
                continue
            for row in train_and_evaluate(name, out, args.data_dir, overrides):
                rows.append({**row, "model_key": model, "dataset_key": dataset})
            save_rows(with_earlier_rows(rows, out / "baselines.json"), out / "baselines.json")
    shown = [m for m in args.models if any(r["model_key"] == m for r in rows)]
    if max_epochs is not None:
        print(
            f"\nEvery model stopped after at most {max_epochs} epochs: a smoke run, not a "
            "reproduction; the verdicts below say nothing about the paper's finding."
        )
    print("\n## Sampled protocol (the SASRec paper's Table III): test HR@10 | NDCG@10\n")
    print(metric_table(rows, "sampled", shown, datasets))
    print("\n" + finding(rows, "sampled", datasets))
    print("\n## Full ranking, filter-seen: test HR@10 | NDCG@10\n")
    print(metric_table(rows, "full", shown, datasets))
    print("\n" + finding(rows, "full", datasets))
    print("\n## Training time on this machine: median s/epoch, epochs (best), total\n")
    print(time_table(rows, shown, datasets))
    print(f"\nrows: {out / 'baselines.json'}")


if __name__ == "__main__":
    run_benchmark(main)
