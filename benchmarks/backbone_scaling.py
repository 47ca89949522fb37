"""How SASRec and Mamba4Rec scale with the history length, on this machine.

At matched width (hidden 64; SASRec+ with 2 blocks and full softmax CE, Mamba4Rec with its
1 layer, N=32, K=4, E=2) and a catalogue of 3,416 items (ML-1M's), on random full-length
histories, for each history length:

- train step: forward + backward of one batch (``--batch-size`` users, loss at every position);
- backbone step: the same without the catalogue softmax (``encode`` -> sum -> backward);
- one user: latency of ``score`` for a single history (inference mode);
- peak memory of one training step, in a fresh process per figure, after a warm-up step at
  length 16 (so loading code - numba's compiled kernels, oneDNN - is not counted). CPU:
  growth of the process's peak RSS (``ru_maxrss``) over its RSS before the step, twice:
  "live", with glibc told to give every allocation of 64 KiB and more its own mapping
  (``MALLOC_MMAP_THRESHOLD_=65536``), so that freed tensors leave the RSS at once and the
  peak follows the tensors alive together (what CUDA's figure measures); and "RSS" with
  glibc's defaults, which keep freed blocks under 32 MiB for reuse, so that figure adds
  allocator slack and moves by a hundred MiB or more from run to run. CUDA:
  ``torch.cuda.max_memory_allocated`` over the allocation before the step.

It also prints the selective scans against the sequential reference (forward + backward,
and each forward alone; d_inner 128, N 32): the chunked PyTorch path ("fast", with its chunk
plan) and the compiled numba kernel ("numba", when installed; also timed alone, on the views
the call passes it, without autograd and the allocations around it), Mamba4Rec's incremental
``step`` against re-encoding a 200-item history, and the Mamba block alone at batch
128 x length 200 (d 64, N 32) with each scan (with numba, the fused block of
``seqrec.nn.mamba_inner``). Mamba4Rec itself runs with ``scan: auto``: the numba kernel,
fused, when it is installed.

Timings are medians of ``--repeats`` calls after a warm-up (the reference scan too, up to
length 200; beyond, its O(L^2) backward is timed once); on a shared machine they move with
the other load.

    .venv/bin/python benchmarks/backbone_scaling.py --quick
    .venv/bin/python benchmarks/backbone_scaling.py --threads 2 --out runs/backbone_scaling.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import at_least, child_stdout, run_benchmark

NUM_ITEMS = 3416  # ML-1M after 5-core filtering
HIDDEN = 64
MODELS: dict[str, dict[str, Any]] = {
    "sasrec": {"name": "sasrec", "num_layers": 2, "num_heads": 1, "dropout": 0.1, "loss": "ce"},
    "mamba4rec": {"name": "mamba4rec", "num_layers": 1, "state_size": 32, "dropout": 0.2},
}


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``repeats`` calls after one warm-up call."""
    fn()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def model_and_batch(name: str, length: int, batch_size: int, device: str) -> tuple[Any, Any]:
    """The model at hidden ``HIDDEN`` and a batch of random full-length histories."""
    import torch

    from seqrec.batch import SeqBatch
    from seqrec.models import build_model, build_model_config

    torch.manual_seed(0)
    section = {**MODELS[name], "hidden_size": HIDDEN, "max_seq_len": length}
    model = build_model(build_model_config(section, num_items=NUM_ITEMS)).to(device)
    items = torch.randint(1, NUM_ITEMS + 1, (batch_size, length + 1), device=device)
    return model.train(), SeqBatch(input_ids=items[:, :-1], labels=items[:, 1:])


def train_step(model: Any, batch: Any) -> None:
    model.zero_grad(set_to_none=True)
    model(batch).loss.backward()


def measure_model(
    name: str, length: int, batch_size: int, repeats: int, device: str
) -> dict[str, Any]:
    """Times of one (model, length) point, run in its own process by ``main``."""
    import torch

    model, batch = model_and_batch(name, length, batch_size, device)

    def backbone_step() -> None:
        model.zero_grad(set_to_none=True)
        model.encode(batch.input_ids)[0].sum().backward()

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    train = timed(lambda: (train_step(model, batch), sync()), repeats)
    backbone = timed(lambda: (backbone_step(), sync()), repeats)
    model.eval()
    one = batch.input_ids[:1]
    with torch.inference_mode():
        latency = timed(lambda: (model.score(one), sync()), max(repeats, 5))
    return {
        "model": name,
        "length": length,
        "batch_size": batch_size,
        "train_step_s": train,
        "backbone_step_s": backbone,
        "one_user_latency_ms": latency * 1e3,
    }


def measure_memory(name: str, length: int, batch_size: int, device: str) -> float:
    """MiB of peak memory growth over one training step (see the module docstring)."""
    import torch

    train_step(*model_and_batch(name, 16, batch_size, device))  # warm-up: loads the kernels
    model, batch = model_and_batch(name, length, batch_size, device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        train_step(model, batch)
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    before = current_rss_bytes()
    train_step(model, batch)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before) / 2**20


def cpu_scans() -> dict[str, Callable[..., Any]]:
    """The CPU scans to time: the chunked path, and the numba kernel when installed."""
    from seqrec.nn.selective_scan import (
        numba_available,
        selective_scan_fast,
        selective_scan_numba,
    )

    scans: dict[str, Callable[..., Any]] = {"fast": selective_scan_fast}
    if numba_available():
        scans["numba"] = selective_scan_numba
    return scans


def scan_row(length: int, batch_size: int, repeats: int, reference_max: int) -> dict[str, Any]:
    import torch

    from seqrec.nn.selective_scan import _chunk_plan, selective_scan_reference

    g = torch.Generator().manual_seed(0)
    channels, state = 2 * HIDDEN, 32
    u = torch.randn(batch_size, channels, length, generator=g)
    delta = torch.nn.functional.softplus(torch.randn(batch_size, channels, length, generator=g))
    A = -torch.arange(1.0, state + 1).repeat(channels, 1)
    B = torch.randn(batch_size, state, length, generator=g)
    C = torch.randn(batch_size, state, length, generator=g)
    D = torch.ones(channels)
    args = [t.requires_grad_() for t in (u, delta, A, B, C, D)]

    def run(scan: Callable[..., Any]) -> Callable[[], None]:
        def step() -> None:
            # As a training step after optimizer.zero_grad() (set_to_none): the gradients
            # are the backward's own tensors. Accumulated into the last call's, they would
            # add a pass over every input's gradient, about a tenth of the numba scan's time.
            for tensor in args:
                tensor.grad = None
            scan(*args)[0].sum().backward()

        return step

    steps, rows = _chunk_plan(u, state, None, None)
    row: dict[str, Any] = {"length": length, "batch_size": batch_size, "chunk": [steps, rows]}
    for name, scan in cpu_scans().items():
        row[f"{name}_s"] = timed(run(scan), repeats)
        with torch.no_grad():
            row[f"{name}_forward_s"] = timed(lambda scan=scan: scan(*args), repeats)
    if "numba" in row_scans(row):
        row["numba_kernel_s"] = timed(numba_kernel_call(*args), repeats)
    if length <= reference_max:
        reference_repeats = repeats if length <= 200 else 1
        row["reference_s"] = timed(run(selective_scan_reference), reference_repeats)
        for name in cpu_scans():
            row[f"{name}_speedup"] = row["reference_s"] / row[f"{name}_s"]
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def row_scans(row: dict[str, Any]) -> list[str]:
    return [name for name in ("fast", "numba") if f"{name}_s" in row]


def numba_kernel_call(u: Any, delta: Any, A: Any, B: Any, C: Any, D: Any) -> Callable[[], None]:
    """The numba kernel's forward and backward alone, on the same transposed views of
    mamba's layout that ``selective_scan_numba`` passes it: the scan without autograd and
    the allocations around it."""
    import numpy as np

    from seqrec.nn.selective_scan import numba_turn, numpy_views, time_major_views

    rows, channels, length = u.shape
    state = A.size(1)
    ut, dt, Bt, Ct = time_major_views(u, delta, B, C)
    At, skip = numpy_views(A.T, D)
    with numba_turn() as kernel:
        segments = -(-length // kernel.SEGMENT)

    def empty(*shape: int) -> Any:
        return np.empty(shape, dtype=np.float32)

    def like(views: Any) -> Any:  # an empty array with the strides of a transposed view
        return np.empty(views.transpose(0, 2, 1).shape, dtype=np.float32).transpose(0, 2, 1)

    y, starts, last = (
        like(ut),
        empty(rows, segments, state, channels),
        empty(rows, state, channels),
    )
    grad_y, grad_last = np.ones_like(y), np.zeros_like(last)
    grads = [like(ut), like(ut), empty(rows, state, channels)]
    grads += [like(Bt), like(Ct), empty(rows, channels)]

    no_padding = np.zeros(rows, dtype=np.int64)

    def call() -> None:
        with numba_turn() as kernel:
            kernel.scan_forward(ut, dt, At, Bt, Ct, skip, y, starts, last, no_padding)
            kernel.scan_backward(
                ut, dt, At, Bt, Ct, skip, starts, grad_y, grad_last, *grads, no_padding
            )

    return call


def incremental_row(users: int, repeats: int) -> dict[str, Any]:
    """Mamba4Rec: one ``step`` after a 200-item history against re-encoding all 201 items."""
    import torch

    from seqrec.models import build_model, build_model_config

    torch.manual_seed(0)
    section = {**MODELS["mamba4rec"], "hidden_size": HIDDEN, "max_seq_len": 201}
    model = build_model(build_model_config(section, num_items=NUM_ITEMS)).eval()
    ids = torch.randint(1, NUM_ITEMS + 1, (users, 201))
    state, _ = model.init_state(ids[:, :200])
    with torch.inference_mode():
        step = timed(lambda: model.step(state, ids[:, 200]), max(repeats, 20))
        full = timed(lambda: model.score(ids), max(repeats, 5))
    return {"users": users, "history": 200, "step_ms": step * 1e3, "reencode_ms": full * 1e3}


def measure_block(repeats: int) -> dict[str, Any]:
    """The Mamba block alone (in_proj, conv, scan, gate, out_proj), batch 128 x length 200,
    with each CPU scan."""
    import torch

    from seqrec.models.mamba4rec import Mamba4RecConfig, MambaBlock

    torch.manual_seed(0)
    config = Mamba4RecConfig(num_items=NUM_ITEMS, hidden_size=HIDDEN, state_size=32)
    block = MambaBlock(config)
    x = torch.randn(128, 200, HIDDEN, requires_grad=True)
    real = torch.ones(128, 200, dtype=torch.bool)

    def step(scan: str) -> None:
        block.zero_grad(set_to_none=True)
        block(x, real, scan, False, False)[0].sum().backward()

    result: dict[str, Any] = {"batch_size": 128, "length": 200, "hidden": HIDDEN, "state": 32}
    for name in cpu_scans():
        result[f"{name}_step_s"] = timed(lambda name=name: step(name), repeats)
    return result


def child(spec: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
    import torch

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    kind = spec["kind"]
    if kind == "model":
        return measure_model(
            spec["model"], spec["length"], spec["batch_size"], spec["repeats"], spec["device"]
        )
    if kind == "memory":
        mib = measure_memory(spec["model"], spec["length"], spec["batch_size"], spec["device"])
        return {"peak_mib": mib}
    if kind == "scans":
        return [
            scan_row(length, spec["batch_size"], spec["repeats"], spec["reference_max"])
            for length in spec["lengths"]
        ]
    if kind == "incremental":
        return [incremental_row(users, spec["repeats"]) for users in (1, 64)]
    return measure_block(spec["repeats"])


def run_child(spec: dict[str, Any], env: dict[str, str] | None = None) -> Any:
    command = [sys.executable, __file__, "--child", json.dumps(spec)]
    environment = {**os.environ, **(env or {})}
    return json.loads(child_stdout(command, environment).strip().splitlines()[-1])


# glibc: allocations of 64 KiB and more get their own mapping, unmapped when freed.
LIVE_MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def memory_figures(spec: dict[str, Any]) -> dict[str, Any]:
    """Peak MiB of one training step: on CUDA allocated bytes; on CPU "live" and "RSS"."""
    spec = {**spec, "kind": "memory"}
    if spec["device"] == "cuda":
        peak = run_child(spec)["peak_mib"]
        return {"train_peak_mib": peak, "memory_measure": "cuda max_memory_allocated"}
    return {
        "train_peak_mib": run_child(spec, LIVE_MEMORY_ENV)["peak_mib"],
        "train_peak_rss_mib": run_child(spec)["peak_mib"],
        "memory_measure": "ru_maxrss growth; live: MALLOC_MMAP_THRESHOLD_=65536",
    }


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed (pip install 'seqrec[plot]'): no plot at {path}")
        return
    from seqrec.io import atomic_path

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for name, color in zip(MODELS, ("tab:blue", "tab:green"), strict=True):
        for key, style, label in (
            ("train_step_s", "-o", "train step"),
            ("backbone_step_s", "--x", "backbone"),
        ):
            points = [(r["length"], r[key]) for r in rows if r["model"] == name]
            ax.plot(*zip(*points, strict=True), style, color=color, label=f"{name} {label}")
    lengths = sorted({r["length"] for r in rows})
    ax.set(xscale="log", yscale="log", xlabel="history length", ylabel="seconds per step")
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.minorticks_off()
    ax.set_title(f"batch {rows[0]['batch_size']}, hidden {HIDDEN}, {NUM_ITEMS} items", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    print(f"plot: {path}")


def print_scans(scans: list[dict[str, Any]], batch_size: int) -> None:
    print(f"\nSelective scan, forward + backward, batch {batch_size}, d_inner 128, N 32")
    names = row_scans(scans[0])
    print(f"{'length':>6} {'reference s':>12}", end="")
    for name in names:
        print(f" {name + ' s':>9} {'speedup':>8} {'fwd s':>7}", end="")
    print(f" {'fast chunk':>11}")
    for r in scans:
        ref = f"{r['reference_s']:>12.3f}" if "reference_s" in r else f"{'skipped':>12}"
        print(f"{r['length']:>6} {ref}", end="")
        for name in names:
            speedup = f"{r[name + '_speedup']:>7.1f}x" if "reference_s" in r else f"{'':>8}"
            print(f" {r[name + '_s']:>9.3f} {speedup} {r[name + '_forward_s']:>7.3f}", end="")
        print(f" {'{} x {}'.format(*r['chunk']):>11}")
    if "numba_kernel_s" in scans[0]:
        print("numba kernel alone (no layout copies, no autograd), forward + backward:")
        for r in scans:
            print(f"{r['length']:>6} {r['numba_kernel_s']:>9.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=at_least(1), nargs="+", default=None)
    parser.add_argument("--batch-size", type=at_least(1), default=64)
    parser.add_argument("--repeats", type=at_least(1), default=None, help="timed calls per figure")
    parser.add_argument(
        "--threads", type=at_least(1), default=None, help="torch threads (default: all)"
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--reference-max-len",
        type=at_least(1),
        default=None,
        help="longest length for the sequential reference scan (its backward is O(L^2))",
    )
    parser.add_argument("--quick", action="store_true", help="lengths up to 800, fewer repeats")
    parser.add_argument("--out", type=Path, default=Path("runs/backbone_scaling.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    lengths = args.lengths or ([50, 200, 800] if args.quick else [50, 200, 800, 2000])
    repeats = args.repeats or (2 if args.quick else 5)
    reference_max = args.reference_max_len or (200 if args.quick else 800)
    common = {"threads": args.threads, "repeats": repeats, "batch_size": args.batch_size}

    from seqrec.io import atomic_write_text

    rows = []
    for length in lengths:
        for name in MODELS:
            spec = {
                **common,
                "kind": "model",
                "model": name,
                "length": length,
                "device": args.device,
            }
            rows.append({**run_child(spec), **memory_figures(spec)})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    scans = run_child(
        {**common, "kind": "scans", "lengths": lengths, "reference_max": reference_max}
    )
    incremental = run_child({**common, "kind": "incremental"})
    block = run_child({**common, "kind": "block"})

    import torch
    from common import describe_machine, machine

    threads = args.threads or torch.get_num_threads()
    on = machine()
    print(f"\non {describe_machine(on)}")
    print(
        f"\nSASRec+ (2 blocks, CE) vs Mamba4Rec (1 layer, N=32), hidden {HIDDEN}, "
        f"{NUM_ITEMS} items, batch {args.batch_size}, {args.device}, {threads} threads, "
        f"median of {repeats}"
    )
    header = ("length", "model", "train s", "backbone s", "1 user ms", "peak MiB", "RSS MiB")
    print("{:>6} {:<10} {:>8} {:>11} {:>10} {:>9} {:>8}".format(*header))
    for r in rows:
        values = (r["length"], r["model"], r["train_step_s"], r["backbone_step_s"])
        rss = f"{r['train_peak_rss_mib']:>8.0f}" if "train_peak_rss_mib" in r else f"{'-':>8}"
        print(
            "{:>6} {:<10} {:>8.3f} {:>11.3f}".format(*values),
            f"{r['one_user_latency_ms']:>10.2f} {r['train_peak_mib']:>9.0f} {rss}",
        )
    if args.device == "cpu":
        print("peak MiB: live tensors (allocator returns freed blocks); RSS: glibc defaults")
    print_scans(scans, args.batch_size)
    names = row_scans(scans[0])
    print("\nMamba4Rec serving: one new item after a 200-item history")
    for r in incremental:
        print(
            f"  {r['users']:>3} user(s): step {r['step_ms']:.2f} ms, re-encode 201 items "
            f"{r['reencode_ms']:.2f} ms ({r['reencode_ms'] / r['step_ms']:.0f}x)"
        )
    print(f"\nMamba block alone, batch 128 x length 200, d {HIDDEN}, N 32 (budget 0.86 s):")
    for name in names:
        label = f"{name} (fused block)" if name == "numba" else name
        print(f"  scan {label}: {block[name + '_step_s']:.3f} s per forward + backward")

    result = {
        "settings": {
            "hidden": HIDDEN,
            "num_items": NUM_ITEMS,
            "batch_size": args.batch_size,
            "device": args.device,
            "threads": threads,
            "repeats": repeats,
            "models": MODELS,
            "machine": on,
        },
        "models": rows,
        "scans": scans,
        "incremental": incremental,
        "block": block,
    }
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    plot(rows, args.out.with_suffix(".png"))


if __name__ == "__main__":
    run_benchmark(main)
