"""Data preparation speed: reading ML-1M, preparing it from scratch, loading it from the cache.

.venv/bin/python benchmarks/data_prep.py --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import tempfile
import time

from common import at_least, run_benchmark

from seqrec.config import DataConfig
from seqrec.data.datasets import locate_dataset
from seqrec.data.prepare import prepare
from seqrec.data.readers import read_interactions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--dataset", default="ml-1m")
    parser.add_argument("--repeats", type=at_least(1), default=3)
    args = parser.parse_args()
    located = locate_dataset(args.dataset, args.data_dir, download=False)
    read, built, loaded = [], [], []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as cache:
            start = time.perf_counter()
            frame = read_interactions(located.path, located.file.format)
            read.append(time.perf_counter() - start)
            start = time.perf_counter()
            data = prepare(DataConfig(dataset=args.dataset), args.data_dir, cache_dir=cache)
            built.append(time.perf_counter() - start)
            start = time.perf_counter()
            prepare(DataConfig(dataset=args.dataset), args.data_dir, cache_dir=cache)
            loaded.append(time.perf_counter() - start)
    print(
        f"{args.dataset} from {located.path}: {frame.height:,} rows read; prepared "
        f"{data.num_users:,} users / {data.num_items:,} items / "
        f"{len(data.sequences.items):,} interactions"
    )
    print(f"read the file          {min(read):.3f} s (best of {args.repeats})")
    print(f"prepare from scratch   {min(built):.3f} s")
    print(f"load from the cache    {min(loaded):.3f} s")


if __name__ == "__main__":
    run_benchmark(main)
