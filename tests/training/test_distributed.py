"""Data-parallel training under torchrun: two real gloo processes on the CPU against one.

Two ranks summing their share of every batch must follow the one-process trajectory: the same
losses, validation metrics and weights, up to the order of floating-point sums.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from seqrec.analysis.depth import depth_curve
from seqrec.cli import main
from seqrec.config import ConfigError, EvalConfig, experiment_from_raw
from seqrec.data.batches import TrainBatches
from seqrec.data.prepare import prepare
from seqrec.evaluation import EvalResult, EvalShare, evaluate_model
from seqrec.models.base import build_model, build_model_config
from seqrec.models.sasrec import SASRecConfig
from seqrec.tokenizers import SemanticIds
from seqrec.training.checkpoint import load_run
from seqrec.training.distributed import SINGLE_PROCESS, DataParallel, data_parallel
from seqrec.training.launch import launched_rank
from seqrec.training.loop import (
    check_data_parallel,
    check_train_config,
    check_trainer_config,
    epoch_randomness,
)
from seqrec.training.run import data_for_run
from seqrec.training.semantic_ids import SEMANTIC_IDS
from tests.cli.helpers import (
    RECREC,
    RECREC_STAGE_2,
    cli_env,
    run_seqrec,
    tiger_raw,
    tiny_raw,
    train_isolated,
    train_recrec_stage_2,
    write_yaml,
)


def torchrun(*args: str, nproc: int = 2, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc-per-node nproc ARGS``, one thread a rank."""
    env = {**cli_env(), "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",  # a free port on the loopback
        "--nproc-per-node",
        str(nproc),
        *args,
    ]
    done = run_as_group(command, env, timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def run_as_group(
    command: list[str], env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``command`` in a process group of its own, killed whole when it overruns ``timeout``:
    killing only torchrun would leave its workers waiting in a collective for an hour."""
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def train_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return torchrun("-m", "seqrec.cli", "train", *args)


def metrics_rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_same_trajectory(
    one: Path, two: Path, noise: tuple[tuple[str, int, int], ...] = (), weight_atol: float = 1e-6
) -> None:
    """The losses, validation metrics, weights and test results of two runs agree.

    ``noise``: (name suffix, first index, end index) slices whose gradient is zero in exact
    arithmetic (the key bias: softmax ignores a constant added to every key's score), so that
    Adam, which divides by the gradient's own scale, turns the sums' rounding into steps of
    the size of the learning rate.
    """
    rows_one, rows_two = metrics_rows(one), metrics_rows(two)
    assert [r["epoch"] for r in rows_two] == [r["epoch"] for r in rows_one]
    for a, b in zip(rows_one, rows_two, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6)
        for key in (k for k in a if k.startswith("valid_")):
            assert b[key] == pytest.approx(a[key], rel=1e-6), key
    weights_one = torch.load(one / "model.pt", weights_only=True)
    weights_two = torch.load(two / "model.pt", weights_only=True)
    assert weights_two.keys() == weights_one.keys()
    for name, tensor in weights_one.items():
        other = weights_two[name].clone()
        for _, start, end in (n for n in noise if name.endswith(n[0])):
            other[start:end] = tensor[start:end]
        torch.testing.assert_close(other, tensor, rtol=1e-5, atol=weight_atol, msg=name)
    results_one = json.loads((one / "results.json").read_text())
    results_two = json.loads((two / "results.json").read_text())
    assert results_two["NDCG@10"] == pytest.approx(results_one["NDCG@10"], rel=1e-6)


def assert_same_rows(rows: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    """The same columns and values, up to the order of floating-point sums."""
    assert [row.keys() for row in rows] == [row.keys() for row in expected]
    for row, want in zip(rows, expected, strict=True):
        assert row == {key: pytest.approx(value, rel=1e-9) for key, value in want.items()}


def batch_size_with_a_one_row_last_batch(raw: dict[str, Any], cache: Path) -> int:
    """A batch size that leaves a last batch of one row: the second rank gets none of it."""
    return batch_size_with_a_last_batch_of(raw, cache, 1)


def batch_size_with_a_last_batch_of(raw: dict[str, Any], cache: Path, last: int) -> int:
    """A batch size in [16, 64) whose last batch has ``last`` rows."""
    config = experiment_from_raw(raw)
    data = prepare(config.data, cache_dir=cache)
    model = build_model(build_model_config(config.model, num_items=data.num_items))
    rows = len(
        TrainBatches(
            sequences=data.split.train,
            users=data.split.train_users,
            num_items=data.num_items,
            max_seq_len=model.config.max_seq_len,
            batch_size=1,
            needs=model.batch_needs,
        )
    )
    size = next((b for b in range(16, 64) if rows % b == last), None)
    assert size is not None, f"no batch size in [16, 64) leaves {last} of {rows} rows"
    return size


def test_two_ranks_train_and_resume_as_one_process(tmp_path: Path) -> None:
    raw = tiny_raw(
        data={"synthetic_users": 160, "synthetic_items": 90},
        model={"loss": "ce", "dropout": 0.0},
        train={"batch_parts": 2},
    )
    raw["train"]["batch_size"] = batch_size_with_a_one_row_last_batch(raw, tmp_path / "cache")
    one = train_isolated(raw, tmp_path / "one", tmp_path / "cache")

    config = write_yaml(tmp_path / "config.yaml", raw)
    two = tmp_path / "two"
    first = train_cli("--config", str(config), "--set", "train.max_epochs=2", "--out", str(two))
    assert len(metrics_rows(two)) == 2
    assert first.stdout.count("trained sasrec: 2 epochs") == 1  # rank 0 reports, once
    assert "data-parallel: rank 0 of 2 (gloo)" in first.stderr
    assert "rank 1 of 2" not in first.stderr  # the other ranks log warnings only

    train_cli("--resume", "--set", "train.max_epochs=3", "--out", str(two))
    key_bias = ("attn.qkv.bias", 16, 32)  # every block's q, k, v biases of hidden size 16
    assert_same_trajectory(one, two, noise=(key_bias,))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_two_nodes_train_as_one_process(tmp_path: Path) -> None:
    """Two torchrun agents, one rank each, meeting at a rendezvous address as two machines do
    (``--nnodes 2 --node-rank R --master-addr ...``): both ranks are their node's first, so
    both prepare the data at once into the cache they share, and the run directory is on a
    file system both see."""
    raw = tiny_raw(
        data={"synthetic_users": 160, "synthetic_items": 90},
        model={"loss": "ce", "dropout": 0.0},
        train={"batch_size": 40},
    )
    one = train_isolated(raw, tmp_path / "one", tmp_path / "cache-one")
    config = write_yaml(tmp_path / "config.yaml", raw)
    two = tmp_path / "two"
    port = str(free_port())
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                f"--node-rank={node}",
                "--nproc-per-node=1",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
                "-m",
                "seqrec.cli",
                "train",
                "--config",
                str(config),
                "--out",
                str(two),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**cli_env(), "OMP_NUM_THREADS": "1"},
            start_new_session=True,  # killed whole, workers included, if it overruns
        )
        for node in (0, 1)
    ]
    try:
        outputs = [node.communicate(timeout=120) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.communicate()
    for node, (_, stderr) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, stderr[-3000:]
    assert "data-parallel: rank 0 of 2 (gloo)" in outputs[0][1]
    assert "trained sasrec: 3 epochs" in outputs[0][0]
    assert "trained sasrec" not in outputs[1][0]  # rank 0 reports
    key_bias = ("attn.qkv.bias", 16, 32)
    assert_same_trajectory(one, two, noise=(key_bias,))
    prepared = Path(os.environ["SEQREC_CACHE_DIR"]) / "prepared"
    assert [p.name.startswith(".") for p in prepared.iterdir()] == [False]  # one whole entry


def test_two_ranks_train_bert4rec_whose_loss_averages_its_masked_items(tmp_path: Path) -> None:
    """A loss over other positions than the labelled ones (``ModelOutput.num_targets``),
    known only after the forward pass: the ranks weigh their shares by them. Each row masks
    its newest item only, so that both runs draw the same masks."""
    raw = tiny_raw(
        model={
            "name": "bert4rec",
            "hidden_size": 16,
            "num_heads": 1,
            "dropout": 0.0,
            "last_item_mask_prob": 1.0,
        },
        train={"batch_size": 40, "max_epochs": 2},
    )
    one = train_isolated(raw, tmp_path / "one", tmp_path / "cache")
    two = tmp_path / "two"
    train_cli("--config", str(write_yaml(tmp_path / "bert4rec.yaml", raw)), "--out", str(two))
    assert_same_trajectory(one, two)


def test_two_ranks_train_duorec_gathering_each_others_views(tmp_path: Path) -> None:
    """DuoRec's InfoNCE compares each row's views with the whole batch's: every rank gathers
    the other's views and gets back the gradient of its own. Without dropout, and contrasting
    the training pass with a second pass (``un``: no same-target draws, which are per rank),
    two ranks follow one process."""
    model = {"name": "duorec", "hidden_size": 16, "max_seq_len": 20, "dropout": 0.0}
    raw = tiny_raw(model={**model, "contrast": "un", "contrastive_weight": 0.5})
    raw["train"] = {**raw.get("train", {}), "max_epochs": 2}
    raw["train"]["batch_size"] = batch_size_with_a_last_batch_of(raw, tmp_path / "cache", 5)
    one = train_isolated(raw, tmp_path / "one", tmp_path / "cache")
    two = tmp_path / "two"
    train_cli("--config", str(write_yaml(tmp_path / "duorec.yaml", raw)), "--out", str(two))
    assert metrics_rows(two)[0]["loss_contrastive"] > 0.1  # the term is there to be gathered
    # Weights within 1e-4: sums taken in another order move a few weights whose gradient is
    # near zero (a ReLU unit that is almost never on) by up to 4e-5 after Adam divides by its
    # scale; without the other rank's share of the gradient, the weights differ by 1e-2.
    assert_same_trajectory(one, two, noise=(("attn.qkv.bias", 16, 32),), weight_atol=1e-4)


def test_two_ranks_train_on_in_batch_negatives_from_both_ranks(tmp_path: Path) -> None:
    """GRU4Rec's BPR-max over in-batch negatives and DuoRec with its same-target views (each
    rank draws its own: no parity), each with a last batch of one row, which both ranks skip
    (a rank without rows could not gather): they train in step. That the draws come from
    both ranks' rows is checked in the collectives test."""
    for name in ("gru4rec", "duorec"):
        raw = tiny_raw(model={"name": name, "hidden_size": 16, "max_seq_len": 20})
        raw["train"] = {**raw.get("train", {}), "max_epochs": 2}
        raw["train"]["batch_size"] = batch_size_with_a_one_row_last_batch(raw, tmp_path / "c")
        run = tmp_path / name
        train_cli("--config", str(write_yaml(tmp_path / f"{name}.yaml", raw)), "--out", str(run))
        rows = metrics_rows(run)  # the run checks that the ranks' weights agree every epoch
        assert len(rows) == 2
        assert all(math.isfinite(row["loss"]) for row in rows)


def test_two_ranks_train_recrec_stage_2_with_an_update_per_round(tmp_path: Path) -> None:
    """Several optimizer steps a batch (RecRec's per-round deep supervision), each summing
    the ranks' gradients, as in one process; validated on the sampled protocol, whose
    negatives the ranks draw as one process does."""
    model = {**RECREC, "dropout": 0.0, "compressor_dropout": 0.0}
    stage_1 = train_isolated(
        tiny_raw(model=model, train={"max_epochs": 1}), tmp_path / "stage1", tmp_path / "cache"
    )
    raw = tiny_raw(
        model={**model, **RECREC_STAGE_2, "supervision_updates": "round"},
        train={"max_epochs": 2, "init_from": str(stage_1), "batch_size": 48},
        eval={"protocol": "sampled", "num_negatives": 50, "batch_size": 32},
    )
    one = train_isolated(raw, tmp_path / "one", tmp_path / "cache")
    two = tmp_path / "two"
    train_cli("--config", str(write_yaml(tmp_path / "stage2.yaml", raw)), "--out", str(two))
    assert_same_trajectory(one, two)


def test_two_ranks_train_tiger_on_the_semantic_ids_rank_0_fits(tmp_path: Path) -> None:
    """Prefix examples, a user token, and semantic IDs fitted once (rank 0) and sent to the
    other rank.

    One epoch, and weights within 1e-4: TIGER at this size amplifies the rounding of sums
    taken in another order (one process on two threads instead of one moves its weights by
    2e-3 after two epochs), where a wrong gradient moves them by far more."""
    sasrec = train_isolated(
        tiny_raw(train={"max_epochs": 1}), tmp_path / "sasrec", tmp_path / "cache"
    )
    raw = tiger_raw(sasrec, dropout=0.0)
    raw["train"]["max_epochs"] = 1
    one = train_isolated(raw, tmp_path / "one", tmp_path / "cache")
    two = tmp_path / "two"
    train_cli("--config", str(write_yaml(tmp_path / "tiger.yaml", raw)), "--out", str(two))
    codes = SemanticIds.load(one / SEMANTIC_IDS).codes
    assert np.array_equal(SemanticIds.load(two / SEMANTIC_IDS).codes, codes)
    assert_same_trajectory(one, two, weight_atol=1e-4)


@pytest.mark.parametrize("protocol", ["full", "sampled"])
def test_two_ranks_evaluate_a_run_as_one_process(tmp_path: Path, protocol: str) -> None:
    """``torchrun ... seqrec evaluate``: the ranks share the users, rank 0 prints and writes
    the whole result, the same as one process gives, rank file included."""
    run = train_isolated(tiny_raw(train={"max_epochs": 1}), tmp_path / "run", tmp_path / "cache")
    args = (str(run), "--protocol", protocol, "--json")
    alone = run_seqrec("evaluate", *args, "--export-ranks", tmp_path / "one.csv")
    assert alone.returncode == 0, alone.stderr
    done = torchrun(
        "-m", "seqrec.cli", "evaluate", *args, "--export-ranks", str(tmp_path / "two.csv")
    )
    assert len(done.stdout.splitlines()) == 1  # one report, rank 0's
    assert json.loads(done.stdout) == json.loads(alone.stdout)
    assert (tmp_path / "two.csv").read_bytes() == (tmp_path / "one.csv").read_bytes()


def test_two_ranks_analyze_depth_as_one_process(tmp_path: Path) -> None:
    """``torchrun ... seqrec analyze depth``: the ranks share the users, rank 0 writes and
    prints the one report, with the curve one process computes."""
    run = train_recrec_stage_2(tmp_path)
    args = (str(run), "--max-depth", "2")
    alone = run_seqrec("analyze", "depth", *args, "--out", tmp_path / "one")
    assert alone.returncode == 0, alone.stderr
    done = torchrun("-m", "seqrec.cli", "analyze", "depth", *args, "--out", str(tmp_path / "two"))
    assert done.stdout.count("report: ") == 1
    rows_one = json.loads((tmp_path / "one" / "depth.json").read_text())
    rows_two = json.loads((tmp_path / "two" / "depth.json").read_text())
    assert_same_rows(rows_two, rows_one)


def test_ranks_stay_in_step_with_dropout_and_sampled_negatives(tmp_path: Path) -> None:
    """With dropout and sampled negatives the ranks draw differently (no parity with one
    process), yet their weights stay identical: the run checks them after every epoch."""
    raw = tiny_raw(model={"loss": "bce", "dropout": 0.3})
    two = tmp_path / "two"
    done = train_cli("--config", str(write_yaml(tmp_path / "c.yaml", raw)), "--out", str(two))
    assert "trained sasrec: 3 epochs" in done.stdout
    assert len(metrics_rows(two)) == 3
    assert json.loads((two / "results.json").read_text())["num_users"] > 0


def test_ranks_share_the_batch_order_and_draw_their_own_samples_and_dropout() -> None:
    def draws(group: DataParallel) -> tuple[list[int], list[int], int]:
        order, sample, torch_seed = epoch_randomness(7, 3, group)
        return order.permutation(50).tolist(), sample.integers(0, 10**9, 5).tolist(), torch_seed

    alone = epoch_randomness(7, 3)
    assert alone[0] is alone[1]  # one process: one stream, as before data-parallel training
    rank_0, rank_1 = (draws(DataParallel(rank=r, world_size=2)) for r in (0, 1))
    assert rank_0[0] == rank_1[0] == draws(SINGLE_PROCESS)[0]
    assert rank_0[1] != rank_1[1]
    assert rank_0[2] != rank_1[2]


WORKER = textwrap.dedent(
    """
    import sys
    import torch
    from torch import nn
    from seqrec.training import distributed
    from seqrec.training.distributed import data_parallel

    distributed.BUCKET_ELEMENTS = 4  # several buckets, and tensors larger than one
    with data_parallel("cpu") as group:
        rank = group.rank
        used, unused, other = (nn.Parameter(torch.zeros(3)) for _ in range(3))
        wide = nn.Parameter(torch.zeros(2, 5))
        half = nn.Parameter(torch.zeros(2, dtype=torch.float64))
        if rank == 0:  # rank 1 had no rows: no gradient there
            used.grad = torch.tensor([1.0, 2.0, 3.0])
        other.grad = torch.full((3,), float(rank + 1))
        wide.grad = torch.arange(10.0).reshape(5, 2).t() * (rank + 1)  # not contiguous
        half.grad = torch.full((2,), 0.5, dtype=torch.float64)
        group.sum_gradients([used, unused, other, half, wide])
        assert torch.equal(used.grad, torch.tensor([1.0, 2.0, 3.0])), used.grad
        assert unused.grad is None
        assert torch.equal(other.grad, torch.full((3,), 3.0)), other.grad
        assert torch.equal(wide.grad, torch.arange(10.0).reshape(5, 2).t() * 3), wide.grad
        assert torch.equal(half.grad, torch.ones(2, dtype=torch.float64)), half.grad
        group.agree(5, "a number")
        try:
            group.agree(rank, "their rank")
        except RuntimeError as err:
            print(f"rank {rank}: {err}")
        else:
            sys.exit(f"rank {rank}: a disagreement went unnoticed")
        summed = group.sum_dicts({"a": 1.0, f"only{rank}": 2.0})
        assert summed == {"a": 2.0, "only0": 2.0, "only1": 2.0}, summed
        assert group.from_main(lambda: f"from {rank}") == "from 0"
        assert group.local_main_first(lambda: f"read by {rank}") == f"read by {rank}"
        for failing in (0, 1):  # the first rank of the machine, then another one
            def work():
                if rank == failing:
                    raise ValueError(f"no data on rank {rank}")
                return "read"
            try:
                group.local_main_first(work)
            except Exception as err:  # every rank raises, none waits for the others
                print(f"rank {rank}: {type(err).__name__}: {err}")
            else:
                sys.exit(f"rank {rank}: rank {failing}'s failure went unnoticed")

        torch.manual_seed(rank)  # different weights on every rank, until the broadcast
        model = nn.Linear(2, 2)
        group.broadcast_module(model)
        group.check_replicas(model)  # identical after the broadcast
        if rank == 1:
            with torch.no_grad():
                model.bias[0] += 1e-6
        try:
            group.check_replicas(model)
        except RuntimeError as err:
            print(f"rank {rank}: {err}")
        else:
            sys.exit(f"rank {rank}: diverged weights went unnoticed")

        from seqrec.nn.row_gather import gather_rows, rows_gathered_over_ranks

        mine = torch.arange(3.0 * (rank + 1)).reshape(rank + 1, 3).add(10 * rank)
        assert gather_rows(mine)[0] is mine  # outside the training loop: its own rows
        with rows_gathered_over_ranks():
            ids, start = gather_rows(torch.tensor([7, 8]) + rank)  # no gradient: plain
            assert ids.tolist() == [7, 8, 8, 9] and start == 2 * rank, (ids, start)
            weight = nn.Parameter(mine.clone())  # ranks hold 1 and 2 rows
            rows, start = gather_rows(weight * 1.0)
            expected = torch.cat([torch.arange(3.0).reshape(1, 3), torch.arange(6.0).reshape(2, 3)])
            expected[1:] += 10
            assert torch.equal(rows, expected) and start == rank, (rows, start)
            scale = torch.tensor([[1.0], [2.0], [3.0]]) * (rank + 1)  # rank 0 x1, rank 1 x2
            (rows * scale).sum().backward()
        # every rank's loss reaches every row: a row's gradient is summed over the ranks
        summed = torch.tensor([[3.0], [6.0], [9.0]]).expand(3, 3)
        assert torch.equal(weight.grad, summed[start : start + rank + 1]), weight.grad
        print(f"rank {rank}: rows gathered")

        from seqrec.models.duorec import info_nce
        from seqrec.models.objective import in_batch_negatives
        from seqrec.models.sasrec import SASRecConfig

        torch.manual_seed(0)  # the same whole batch on both ranks: 4 rows on rank 0, 3 on 1
        views = torch.randn(2, 7, 5, requires_grad=True)
        targets = torch.tensor([1, 2, 1, 3, 2, 4, 4])
        whole = info_nce(views[0], views[1], temperature=0.7, targets=targets) * 7
        (expected,) = torch.autograd.grad(whole, views)
        mine = slice(0, 4) if rank == 0 else slice(4, 7)
        part = views.detach()[:, mine].clone().requires_grad_(True)
        with rows_gathered_over_ranks():
            loss = info_nce(part[0], part[1], temperature=0.7, targets=targets[mine])
            (loss * part.size(1)).backward()
        # each rank's anchors against every view; the ranks' sums are the batch's
        total = torch.tensor([float(loss) * part.size(1)])
        torch.distributed.all_reduce(total)
        assert torch.allclose(total, whole.detach().reshape(1), rtol=1e-5), (total, whole)
        assert torch.allclose(part.grad, expected[:, mine], atol=1e-6), (part.grad, expected)

        config = SASRecConfig(num_items=50, loss="bpr", negative_sampler="in_batch",
                              num_negatives=400)
        with rows_gathered_over_ranks():
            drawn = set(in_batch_negatives(config, torch.tensor([1, 2, 3]) + 10 * rank).tolist())
        assert drawn == {1, 2, 3, 11, 12, 13}, drawn  # from both ranks' targets
        print(f"rank {rank}: views and negatives gathered")
    """
)


def test_collectives_of_the_data_parallel_group(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    done = torchrun(str(script))
    for rank in (0, 1):
        assert f"rank {rank}: the ranks disagree on their rank (0, 1 on ranks 0..1)" in done.stdout
        assert f"rank {rank}: the ranks' weights differ after an epoch" in done.stdout
        assert f"rank {rank}: ValueError: no data on rank {rank}" in done.stdout
    for rank, what in ((1, "preparing"), (0, "reading")):
        assert f"rank {rank}: DataError: another rank failed while {what} the data" in done.stdout
    for rank in (0, 1):
        assert f"rank {rank}: rows gathered" in done.stdout
        assert f"rank {rank}: views and negatives gathered" in done.stdout


def test_data_parallel_batches_split_every_step_between_the_ranks() -> None:
    raw = tiny_raw(data={"synthetic_users": 90, "synthetic_items": 60})
    config = experiment_from_raw(raw)
    data = prepare(config.data)

    def steps(rank: int, world_size: int, parts: int) -> list[list[np.ndarray]]:
        batches = TrainBatches(
            sequences=data.split.train,
            users=data.split.train_users,
            num_items=data.num_items,
            max_seq_len=20,
            batch_size=16,
            parts=parts,
            rank=rank,
            world_size=world_size,
        )
        return [
            [np.asarray(part.labels) for part in step]
            for step in batches.steps(np.random.default_rng(7), np.random.default_rng(rank))
        ]

    whole = steps(0, 1, 1)
    shares = [steps(rank, 3, 2) for rank in range(3)]
    assert all(len(share) == len(whole) for share in shares)  # every rank joins every step
    for k, (batch,) in enumerate(whole):
        labels = [row[row > 0].tolist() for row in batch]
        pieces = [row[row > 0].tolist() for share in shares for part in share[k] for row in part]
        assert sorted(pieces) == sorted(labels)  # the ranks' rows are the batch's, once each
        sizes = [sum(len(part) for part in share[k]) for share in shares]
        assert max(sizes) - min(sizes) <= 1
        assert all(len(share[k]) == min(2, size) for share, size in zip(shares, sizes, strict=True))


def test_models_that_cannot_split_a_batch_between_ranks_are_refused() -> None:
    raw = tiny_raw()
    raw["model"] = {"name": "pop"}
    config = experiment_from_raw(raw)
    built = build_model(build_model_config(config.model, num_items=50, num_users=10))
    check_trainer_config(built, config, world_size=1)
    counting = "pop learns by counting in one pass over the data, with nothing to split"
    with pytest.raises(ConfigError, match=counting):
        check_trainer_config(built, config, world_size=2)
    with pytest.raises(ConfigError, match=counting):  # from the config alone: before the data
        check_train_config(config, world_size=2)

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class CoupledRows(SASRecConfig):  # a loss that couples rows without gathering them
        @property
        def loss_splits_by_rows(self) -> bool:
            return False

    check_data_parallel(CoupledRows(num_items=50), world_size=1)
    with pytest.raises(ConfigError, match="splits by rows or gathers them from every rank"):
        check_data_parallel(CoupledRows(num_items=50), world_size=2)


def test_a_model_that_trains_on_another_runs_weights_needs_init_from() -> None:
    """A stage-2 RecRec without it trained its reasoner over a random, frozen backbone."""
    raw = tiny_raw(model={"name": "recrec", "stage": 2, "hidden_size": 16, "max_seq_len": 20})
    with pytest.raises(ConfigError, match="train.init_from is not set: a stage-2 RecRec"):
        check_train_config(experiment_from_raw(raw))
    raw["train"] = {"init_from": "runs/stage-1"}
    check_train_config(experiment_from_raw(raw))


@pytest.mark.parametrize(
    "model",
    [
        {"name": "duorec", "hidden_size": 16, "max_seq_len": 20},
        {"name": "gru4rec", "hidden_size": 16, "max_seq_len": 20},  # in-batch negatives
    ],
)
def test_models_that_gather_rows_share_a_batch_between_ranks_but_not_between_parts(
    model: dict[str, Any],
) -> None:
    raw = tiny_raw(model=model)
    config = experiment_from_raw(raw)
    built = build_model(build_model_config(config.model, num_items=50, num_users=10))
    assert built.config.loss_gathers_rows
    assert not built.config.loss_splits_by_rows
    check_trainer_config(built, config, world_size=2)
    raw["train"] = {**raw.get("train", {}), "batch_parts": 2}
    with pytest.raises(ConfigError, match="train.batch_parts needs a loss that splits by rows"):
        check_trainer_config(built, experiment_from_raw(raw), world_size=1)
    # a batch of one row has no row for the second process: every step was skipped, silently
    raw["train"] = {"batch_size": 1}
    one_row = experiment_from_raw(raw)
    check_train_config(one_row, world_size=1)
    with pytest.raises(ConfigError, match=r"train.batch_size 1 is below the 2 processes: .* every"):
        check_train_config(one_row, world_size=2)


def test_a_rank_without_a_world_size_is_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Other launchers set RANK for their own purposes: only torchrun's WORLD_SIZE > 1 makes
    this process a rank of a group (and silences its report)."""
    monkeypatch.setenv("RANK", "3")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert launched_rank() == 0
    with data_parallel("cpu") as group:
        assert group == SINGLE_PROCESS


@pytest.mark.parametrize(("rank", "prefix"), [("0", ""), ("1", "[rank 1] ")])
def test_an_error_under_torchrun_is_one_line_naming_a_rank_other_than_0(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    rank: str,
    prefix: str,
) -> None:
    """Every process prints its error; the lines of two ranks once ran together."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", rank)
    assert main(["evaluate", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == (
        f"{prefix}error: run directory {tmp_path / 'nope'} does not exist\n"
    )


class SummingExchange:
    """``EvalShare.add_up`` for processes simulated by threads: each call waits for every
    thread's array and returns their sum, as an all-reduce does."""

    def __init__(self, count: int) -> None:
        self._barrier = threading.Barrier(count)
        self._arrays: dict[int, np.ndarray] = {}
        self.calls = 0  # by thread 0

    def add_up(self, index: int) -> Any:
        def add_up(values: np.ndarray) -> np.ndarray:
            self._arrays[index] = values.copy()
            self.calls += index == 0
            self._barrier.wait()
            total: np.ndarray = sum(self._arrays.values())  # type: ignore[assignment]
            self._barrier.wait()  # every thread has its sum before the next call overwrites
            return total

        return add_up


@pytest.mark.parametrize("protocol", ["full", "sampled"])
@pytest.mark.parametrize(("count", "chunk_users"), [(3, 16), (3, 1000)])
def test_evaluation_shared_between_processes_equals_one_process(
    protocol: str, count: int, chunk_users: int
) -> None:
    """Every process gets the whole result, with the ranks one process computes (the
    sampled negatives too); with more processes than chunks some rank none."""
    raw = tiny_raw(data={"synthetic_users": 90, "synthetic_items": 60})
    config = experiment_from_raw(raw)
    data = prepare(config.data)
    model = build_model(build_model_config(config.model, num_items=data.num_items))
    eval_config = EvalConfig(protocol=protocol, num_negatives=20, batch_size=chunk_users)  # type: ignore[arg-type]
    alone = evaluate_model(model, data, eval_config)
    exchange = SummingExchange(count)

    def share(index: int) -> EvalResult:
        return evaluate_model(
            model, data, eval_config, share=EvalShare(index, count, exchange.add_up(index))
        )

    with ThreadPoolExecutor(count) as pool:
        shared = list(pool.map(share, range(count)))
    for result in shared:
        np.testing.assert_array_equal(result.ranks, alone.ranks)
        assert result.metrics == alone.metrics
        assert result.protocol == alone.protocol


def test_depth_curve_shared_between_processes_equals_one_process(tmp_path: Path) -> None:
    """Every depth's metrics and the interest cosines (means over every process's users)."""
    run = load_run(train_recrec_stage_2(tmp_path))
    data = data_for_run(run)
    eval_config = dataclasses.replace(run.config.eval, batch_size=16)
    alone = depth_curve(run.model, data, eval_config, max_depth=3)
    count = 3
    exchange = SummingExchange(count)

    def share(index: int) -> list[dict[str, Any]]:
        return depth_curve(
            run.model,
            data,
            eval_config,
            max_depth=3,
            share=EvalShare(index, count, exchange.add_up(index)),
        )

    with ThreadPoolExecutor(count) as pool:
        shared = list(pool.map(share, range(count)))
    assert exchange.calls == 3  # twice for the ranks, once for the interest cosines
    for rows in shared:
        assert_same_rows(rows, alone)
