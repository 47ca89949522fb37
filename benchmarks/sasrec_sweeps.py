"""The SASRec paper's sweeps on ML-1M: NDCG@10 against the hidden size d (Fig. 2) and against
the maximum length n, with training time (Table V). One SASRec is trained to early stopping
per point with the paper's ML-1M settings (configs/ml-1m_sasrec.yaml: 2 blocks, 1 head,
dropout 0.2, BCE with one negative, Adam 1e-3, batch 128) and evaluated on test under the
paper's sampled protocol (target + 100 never-seen items) and under full ranking.

    d in {10, 20, 30, 40, 50} at n = 200;  n in {10, 50, 100, 200, 300, 400, 500, 600} at d = 50

Prints a Markdown table per sweep beside the paper's Table V, writes every row to
<out>/sweeps.json and the curves to <out>/sweep_d.png and <out>/sweep_n.png (matplotlib,
``pip install 'seqrec[plot]'``). Run directories are resumed, so an interrupted sweep
continues where it stopped.

    .venv/bin/python benchmarks/sasrec_sweeps.py --data-dir ../shared/data          # many hours
    .venv/bin/python benchmarks/sasrec_sweeps.py --data-dir ../shared/data --quick  # minutes

``--dims`` / ``--lengths`` train a subset (e.g. two processes, one per sweep); rows of every
trained point are merged into the one sweeps.json and the tables show all of them.

For n >= 400 add ``--set train.batch_parts=4``: nearly every random batch of 128 ML-1M users
holds one history that fills the window, so whole batches are padded to n; in four
length-sorted parts the step has the same gradient (other dropout and negative draws) and
at n = 500 took 18 s per epoch on one thread against 52 s.

``--quick`` trains 3 points (d 10 and 50 at n = 50, n = 10 at d = 50) for 2 epochs each: a
check that the sweep runs end to end, not a reproduction.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from common import at_least, run_benchmark, save_rows, train_and_evaluate

from seqrec.analysis.figures import matplotlib_missing, sweep_lines

CONFIG = "ml-1m_sasrec"
DIMS = (10, 20, 30, 40, 50)
LENGTHS = (10, 50, 100, 200, 300, 400, 500, 600)
DEFAULT_D, DEFAULT_N = 50, 200
# SASRec paper Table V (anchors.md 1.2, unverified against the PDF): n -> (seconds, NDCG@10).
PAPER_TABLE_V = {
    10: (75, 0.480),
    50: (101, 0.557),
    100: (157, 0.571),
    200: (341, 0.587),
    300: (613, 0.593),
    400: (965, 0.594),
    500: (1400, 0.596),
    600: (1900, 0.595),
}


def points(
    quick: bool, dims: list[int] | None = None, lengths: list[int] | None = None
) -> list[tuple[str, int, int]]:
    """(sweep, d, n) for every training run; the shared point is trained once."""
    if quick:
        return [("d", 10, 50), ("d", 50, 50), ("n", 50, 10)]
    dims = list(DIMS) if dims is None else dims
    lengths = list(LENGTHS) if lengths is None else lengths
    return [("d", d, DEFAULT_N) for d in dims] + [("n", DEFAULT_D, n) for n in lengths]


def merged_rows(path: Path, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` plus the rows already in ``path`` for points this invocation did not train,
    so that sweeps run as several processes (``--dims`` / ``--lengths``) share one file."""
    if not path.exists():
        return rows
    ours = {(r["d"], r["n"]) for r in rows}
    kept = [r for r in json.loads(path.read_text()) if (r["d"], r["n"]) not in ours]
    return kept + rows


def train_point(
    d: int, n: int, out: Path, data_dir: str | None, extra: list[str]
) -> list[dict[str, Any]]:
    overrides = [f"model.hidden_size={d}", f"model.max_seq_len={n}", *extra]
    rows = train_and_evaluate(CONFIG, out / f"d{d}_n{n}", data_dir, overrides)
    return [{**row, "d": d, "n": n} for row in rows]


def table(rows: list[dict[str, Any]], sweep: str, keys: list[tuple[int, int]]) -> str:
    by_key = {(r["d"], r["n"], r["protocol"]): r for r in rows}
    head = "| d | n | sampled NDCG@10 | full NDCG@10 | s/epoch | epochs (best) | total train |"
    lines = [
        head + (" paper NDCG@10 | paper time |" if sweep == "n" else ""),
        "|" + "---:|" * (7 + (2 if sweep == "n" else 0)),
    ]
    for d, n in keys:
        s, f = by_key.get((d, n, "sampled")), by_key.get((d, n, "full"))
        if s is None or f is None:
            continue
        cells = [
            str(d),
            str(n),
            f"{s['NDCG@10']:.4f}",
            f"{f['NDCG@10']:.4f}",
            f"{s['median_epoch_seconds']:.1f}",
            f"{s['epochs']} ({s['best_epoch']})",
            f"{s['train_seconds'] / 60:.1f} min",
        ]
        if sweep == "n":
            paper = PAPER_TABLE_V.get(n)
            cells += [f"{paper[1]:.3f}", f"{paper[0]} s"] if paper else ["–", "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figures(
    rows: list[dict[str, Any]], keys: dict[str, list[tuple[int, int]]], out: Path
) -> list[Path]:
    """The sweeps' PNGs, written into ``out``."""
    missing = matplotlib_missing()
    if missing:
        logging.warning("%s", missing)
        return []
    written: list[Path] = []
    sampled = {(r["d"], r["n"]): r for r in rows if r["protocol"] == "sampled"}
    full = {(r["d"], r["n"]): r for r in rows if r["protocol"] == "full"}
    for sweep, label in (("d", "hidden size d"), ("n", "maximum length n")):
        done = [k for k in keys[sweep] if k in sampled and k in full]
        if not done:
            continue
        x = [k[0] if sweep == "d" else k[1] for k in done]
        series = {
            "sampled (100 negatives)": (x, [sampled[k]["NDCG@10"] for k in done]),
            "full ranking": (x, [full[k]["NDCG@10"] for k in done]),
        }
        if sweep == "n":
            papers = [k for k in done if k[1] in PAPER_TABLE_V]
            series["paper, Table V (sampled)"] = (
                [k[1] for k in papers],
                [PAPER_TABLE_V[k[1]][1] for k in papers],
            )
        sweep_lines(
            series,
            label,
            "test NDCG@10",
            f"SASRec on ML-1M: NDCG@10 vs {label}",
            out / f"sweep_{sweep}.png",
        )
        seconds = {"s/epoch": (x, [sampled[k]["median_epoch_seconds"] for k in done])}
        sweep_lines(
            seconds,
            label,
            "median seconds per epoch",
            f"training time vs {label}",
            out / f"sweep_{sweep}_time.png",
        )
        written += [out / f"sweep_{sweep}.png", out / f"sweep_{sweep}_time.png"]
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/sweeps", help="parent of the run directories")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument(
        "--quick", action="store_true", help="3 points, 2 epochs each (not --dims, --lengths)"
    )
    parser.add_argument("--max-epochs", type=at_least(1), default=None, help="cap epochs")
    parser.add_argument("--set", action="append", default=[], help="override a config key")
    parser.add_argument(
        "--dims",
        type=at_least(1),
        nargs="*",
        default=None,
        help=f"d values to train (default {DIMS})",
    )
    parser.add_argument(
        "--lengths", type=at_least(1), nargs="*", default=None, help=f"n values (default {LENGTHS})"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    max_epochs = 2 if args.quick and args.max_epochs is None else args.max_epochs
    extra = [*args.set, "train.progress=False"]
    if max_epochs is not None:
        extra += [f"train.max_epochs={max_epochs}", f"train.patience={max_epochs}"]
    out = Path(args.out) / ("quick" if args.quick else "")
    rows_path = out / "sweeps.json"
    rows: list[dict[str, Any]] = []
    trained: set[tuple[int, int]] = set()
    for _, d, n in points(args.quick, args.dims, args.lengths):
        if (d, n) not in trained:
            rows += train_point(d, n, out, args.data_dir, extra)
            trained.add((d, n))
            save_rows(merged_rows(rows_path, rows), rows_path)
    rows = merged_rows(rows_path, rows)
    done = {(r["d"], r["n"]) for r in rows}
    if args.quick:
        keys = {
            sweep: [(d, n) for s, d, n in points(True) if s == sweep and (d, n) in done]
            for sweep in ("d", "n")
        }
    else:  # every point trained, by this process or an earlier one, on either axis
        keys = {
            "d": sorted(k for k in done if k[1] == DEFAULT_N),
            "n": sorted((k for k in done if k[0] == DEFAULT_D), key=lambda k: k[1]),
        }
    print("\n## NDCG@10 vs hidden size d (SASRec paper Fig. 2), test\n")
    print(table(rows, "d", keys["d"]))
    print("\n## NDCG@10 and training time vs maximum length n (SASRec paper Table V), test\n")
    print(table(rows, "n", keys["n"]))
    written = figures(rows, keys, out)
    shown = ", ".join(str(path) for path in written) or "none"
    print(f"\nrows: {out / 'sweeps.json'}; figures: {shown}")


if __name__ == "__main__":
    run_benchmark(main)
