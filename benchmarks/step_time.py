r"""Wall and CPU time of a few training steps of any config, without training a whole epoch.

Builds the config's model and training batches as ``seqrec train`` does (the first epoch's
random batches, from the config's seed), runs ``--warmup`` optimizer steps, then times the
next ``--steps``, and prints seconds per step, wall and process CPU time (user + system, all
threads), and training targets per second. On a machine shared with other jobs the CPU time
moves much less with their load than the wall time, so compare two versions of the code by
running this alternately on each (one from a git worktree through ``PYTHONPATH``), same
arguments, a few times.

    .venv/bin/python benchmarks/step_time.py configs/ml-1m_sasrec.yaml --set train.batch_parts=4 \
        --steps 12 --threads 1 --data-dir ../shared/data
    PYTHONPATH=/path/to/worktree/src .venv/bin/python benchmarks/step_time.py ...
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from pathlib import Path

import torch
from common import at_least, machine, run_benchmark

from seqrec.config import experiment_from_raw, load_raw
from seqrec.data.prepare import prepare
from seqrec.training.loop import Trainer, epoch_seeds, seed_everything
from seqrec.training.run import model_for_data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=at_least(1), default=10, help="timed optimizer steps")
    parser.add_argument("--warmup", type=at_least(0), default=2, help="untimed steps before them")
    parser.add_argument("--threads", type=at_least(1), default=None, help="torch threads")
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    config = experiment_from_raw(load_raw(args.config, args.set))
    data = prepare(config.data, args.data_dir)
    seed_everything(config.train.seed)
    with tempfile.TemporaryDirectory() as scratch:  # semantic IDs are fitted or read, not kept
        model, _ = model_for_data(config, data, args.data_dir, Path(scratch), resume=False)
    trainer = Trainer(model, data, config)
    rng, seed = epoch_seeds(config.train.seed, 1)
    torch.manual_seed(seed)
    steps = trainer.batches.steps(rng)
    warmup = list(itertools.islice(steps, args.warmup))
    timed = list(itertools.islice(steps, args.steps))
    if len(timed) < args.steps:
        parser.error(f"an epoch has {args.warmup + len(timed)} steps; ask for fewer")
    trainer.train_steps(warmup)
    wall, cpu = time.perf_counter(), time.process_time()
    stats = trainer.train_steps(timed)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    row = {
        "config": str(args.config),
        "set": args.set,
        "threads": torch.get_num_threads(),
        "steps": args.steps,
        "wall_s_per_step": round(wall / args.steps, 4),
        "cpu_s_per_step": round(cpu / args.steps, 4),
        "targets_per_second": round(stats.targets / wall, 1),
        "machine": machine(),
    }
    print(json.dumps(row))


if __name__ == "__main__":
    run_benchmark(main)
