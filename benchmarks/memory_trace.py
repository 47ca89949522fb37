"""Where a training step's memory goes: resident memory at every module's forward and
backward hooks (top-level modules and their children) during one step, and the peak between
consecutive hooks, sampled every 0.5 ms by a thread.

Run with glibc told to unmap freed blocks (as backbone_scaling.py's "live" figure), so the
resident memory follows the tensors alive:

    MALLOC_MMAP_THRESHOLD_=65536 .venv/bin/python benchmarks/memory_trace.py mamba4rec 2000
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from backbone_scaling import MODELS, model_and_batch, train_step
from common import at_least, run_benchmark

PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=list(MODELS))
    parser.add_argument("length", type=at_least(1))
    parser.add_argument("--batch-size", type=at_least(1), default=64)
    parser.add_argument("--threads", type=at_least(1), default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    train_step(*model_and_batch(args.model, 16, args.batch_size, "cpu"))  # loads the kernels
    model, batch = model_and_batch(args.model, args.length, args.batch_size, "cpu")
    events: list[tuple[float, str, float]] = []

    def mark(label: str) -> None:
        events.append((time.perf_counter(), label, resident_mib()))

    for name, module in model.named_modules():
        if name and name.count(".") <= 2:
            module.register_forward_pre_hook(lambda m, a, n=name: mark(f"forward > {n}"))
            module.register_forward_hook(lambda m, a, o, n=name: mark(f"forward < {n}"))
            module.register_full_backward_hook(lambda m, gi, go, n=name: mark(f"backward < {n}"))
    samples: list[tuple[float, float]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((time.perf_counter(), resident_mib()))
            time.sleep(0.0005)

    base = resident_mib()
    sampler = threading.Thread(target=sample)
    sampler.start()
    mark("start")
    model.zero_grad(set_to_none=True)
    loss = model(batch).loss
    mark("loss")
    loss.backward()
    mark("end")
    done.set()
    sampler.join()
    print(f"{args.model}, length {args.length}, batch {args.batch_size}: MiB over the start")
    print(f"peak {max(v for _, v in samples) - base:.0f} MiB")
    print(f"{'s':>7} {'now':>6} {'peak since last':>15}  hook")
    previous = events[0][0]
    for when, label, mib in events:
        inside = [v for t, v in samples if previous <= t <= when]
        peak = f"{max(inside) - base:15.0f}" if inside else f"{'-':>15}"
        print(f"{when - events[0][0]:7.3f} {mib - base:6.0f} {peak}  {label}")
        previous = when


if __name__ == "__main__":
    run_benchmark(main)
