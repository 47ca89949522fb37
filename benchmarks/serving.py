"""Latency of `seqrec serve` over HTTP: a stateless /recommend carrying a whole history,
against a session event that carries one new item (GRU4Rec, Mamba4Rec).

The models are the ML-1M configs (configs/ml-1m_{sasrec-ce,gru4rec,mamba4rec}.yaml) with
fresh weights over an ML-1M-sized catalogue of 3,416 items: latency does not depend on what
the weights learned. Each is served by uvicorn on a local socket, in this process, and called
by one client in sequence; every figure is the median and 95th percentile of ``--requests``
calls, after 20 warm-up calls.

    .venv/bin/python benchmarks/serving.py --threads 1
    .venv/bin/python benchmarks/serving.py --lengths 50 200 --requests 500 --out runs/serving.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from common import at_least, run_benchmark

from seqrec.config import load_raw
from seqrec.data.idmap import IdMap
from seqrec.io import atomic_write_text
from seqrec.models import build_model, build_model_config
from seqrec.serving.http import create_app
from seqrec.serving.predictor import Predictor
from seqrec.serving.sessions import supports_sessions

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.training.http_client import call, served  # noqa: E402  (the tests' real client)

NUM_ITEMS = 3416  # ML-1M after 5-core filtering
CONFIGS = {"sasrec": "ml-1m_sasrec-ce", "gru4rec": "ml-1m_gru4rec", "mamba4rec": "ml-1m_mamba4rec"}
WARM_UP = 20
SESSIONS = 16  # sessions that the event calls take turns on


def predictor(name: str) -> Predictor:
    torch.manual_seed(0)
    section = load_raw(REPO / "configs" / f"{CONFIGS[name]}.yaml", [])["model"]
    model = build_model(build_model_config(section, num_items=NUM_ITEMS))
    id_map = IdMap(users=[], items=[str(i) for i in range(1, NUM_ITEMS + 1)])
    return Predictor(model, id_map)


def percentiles(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        "p50_ms": statistics.median(ordered) * 1e3,
        "p95_ms": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] * 1e3,
    }


def timed_calls(base: str, requests: int, make: Any) -> dict[str, float]:
    """make(i) -> (path, body, method); each call must answer 200."""
    seconds = []
    for i in range(WARM_UP + requests):
        path, body, method = make(i)
        start = time.perf_counter()
        status, answer = call(base, path, body, method=method)
        elapsed = time.perf_counter() - start
        if status != 200:
            raise RuntimeError(f"{path} answered {status}: {answer}")
        if i >= WARM_UP:
            seconds.append(elapsed)
    return percentiles(seconds)


def history(length: int, user: int) -> list[str]:
    generator = torch.Generator().manual_seed(user)
    ids = torch.randint(1, NUM_ITEMS + 1, (length,), generator=generator)
    return [str(i) for i in ids.tolist()]


def measure(name: str, lengths: list[int], requests: int) -> list[dict[str, Any]]:
    rows = []
    served_predictor = predictor(name)
    with served(create_app(served_predictor)) as base:
        for length in lengths:
            row: dict[str, Any] = {"model": name, "history": length}
            row["recommend"] = timed_calls(
                base,
                requests,
                lambda i, n=length: ("/recommend", {"history": history(n, i), "k": 10}, None),
            )
            if supports_sessions(served_predictor):
                # Sessions started from a history of this length, then one event per call.
                for user in range(SESSIONS):
                    body = {"history": history(length, user), "k": 10}
                    call(base, f"/sessions/u{user}", body, method="PUT")
                row["session_event"] = timed_calls(
                    base,
                    requests,
                    lambda i: (
                        f"/sessions/u{i % SESSIONS}/events",
                        {"item": str(1 + (7 * i) % NUM_ITEMS), "k": 10},
                        None,
                    ),
                )
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=at_least(1), nargs="+", default=[50, 200])
    parser.add_argument("--requests", type=at_least(1), default=300)
    parser.add_argument("--threads", type=at_least(1), default=None, help="torch threads")
    parser.add_argument("--out", type=Path, default=Path("runs/serving.json"))
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rows = [row for name in CONFIGS for row in measure(name, args.lengths, args.requests)]
    print(f"HTTP round trip, one client, {args.requests} calls per figure, median / p95 in ms")
    print(f"{'model':<10} {'history':>7}  {'/recommend':>16}  {'session event':>16}")
    for row in rows:
        cells = []
        for key in ("recommend", "session_event"):
            figure = row.get(key)
            cells.append(f"{figure['p50_ms']:7.2f} / {figure['p95_ms']:6.2f}" if figure else "–")
        print(f"{row['model']:<10} {row['history']:>7}  {cells[0]:>16}  {cells[1]:>16}")
    atomic_write_text(args.out, json.dumps(rows, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    run_benchmark(main)
