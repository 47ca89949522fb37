"""GFLOP/s of the three products of a float32 linear layer, MKL (torch's default) against
oneDNN (``seqrec.nn.linear``), on this machine's CPU, at the shapes of RecRec's reasoner and
compressor (4096 rows: a block of 32 prefixes x 8 interests x 16 rows) and of SASRec's layers.

Each product is timed in interleaved rounds; the best and the median round are printed.

    .venv/bin/python benchmarks/linear_kernels.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from common import at_least, run_benchmark
from torch import Tensor

from seqrec.nn.linear import onednn_product

# (rows, in features, out features)
SHAPES = [
    (4096, 64, 64),  # reasoner q, proj
    (4096, 64, 128),  # reasoner kv
    (4096, 64, 170),  # reasoner SwiGLU W1, W3 (2/3 of 4 d)
    (4096, 170, 64),  # reasoner SwiGLU W2
    (4096, 64, 256),  # compressor FFN in
    (6400, 50, 150),  # SASRec qkv, 32 rows of 200
    (6400, 50, 50),  # SASRec FFN, proj
]


def products(x: Tensor, weight: Tensor, grad: Tensor) -> dict[str, dict[str, Callable[[], Tensor]]]:
    """For each product, how MKL (as autograd calls it) and oneDNN compute it."""
    weight_t = weight.t().contiguous()
    return {
        "forward X W^T": {
            "mkl": lambda: x @ weight.t(),
            "onednn": lambda: onednn_product(x, weight, None),
        },
        "input grad dY W": {
            "mkl": lambda: grad @ weight,
            "onednn": lambda: onednn_product(grad, weight_t, None),
        },
        "weight grad dY^T X": {
            "mkl": lambda: grad.t() @ x,
            "onednn": lambda: onednn_product(grad.t(), x.t(), None),
        },
    }


def gflops(run: Callable[[], Tensor], flops: int) -> float:
    start = time.perf_counter()
    run()
    return flops / (time.perf_counter() - start) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=at_least(1), default=1)
    parser.add_argument("--rounds", type=at_least(1), default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}; GFLOP/s best / median of {args.rounds} rounds")
    print("| rows, in, out | product | MKL | oneDNN |")
    print("|---|---|---:|---:|")
    g = torch.Generator().manual_seed(0)
    for rows, d_in, d_out in SHAPES:
        x = torch.randn(rows, d_in, generator=g)
        weight = torch.randn(d_out, d_in, generator=g)
        grad = torch.randn(rows, d_out, generator=g)
        flops = 2 * rows * d_in * d_out
        for product, kernels in products(x, weight, grad).items():
            rates: dict[str, list[float]] = {name: [] for name in kernels}
            for run in kernels.values():
                run()  # warm-up
            for _ in range(args.rounds):  # interleaved: both see the same machine
                for name, run in kernels.items():
                    rates[name].append(gflops(run, flops))
            cells = [f"{max(r):.0f} / {statistics.median(r):.0f}" for r in rates.values()]
            print(f"| {rows}, {d_in}, {d_out} | {product} | {' | '.join(cells)} |")


if __name__ == "__main__":
    run_benchmark(main)
