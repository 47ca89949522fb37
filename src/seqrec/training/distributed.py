"""Data-parallel training over the processes ``torchrun`` launches, on one machine or many.

``torchrun --nproc-per-node P -m seqrec.cli train --config ... --out RUN`` starts P copies of
the same command; torchrun tells each its place through the environment (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``). Every rank holds the whole
model and trains on its share of each batch; the config means what it means in one process:
``train.batch_size`` is the number of rows per optimizer step over all ranks together, and a
run on P ranks follows the same trajectory as a run in one process (up to the order in which
floating-point sums are taken, and the draws of dropout and negatives, which are per rank).

How a step is shared:
- Every rank draws the same batch order from the epoch's shared seed; each rank takes every
  P-th row of a batch sorted by history length (similar work per rank), in ``batch_parts``
  parts of its own. A rank may get no row of a small last batch: it still joins the step's
  collectives with a zero gradient.
- Each part backpropagates its mean loss times its loss positions (``ModelOutput.num_targets``,
  known only after the forward pass for BERT4Rec); the gradients and the positions are summed
  over the ranks (all-reduce) and the gradient is divided by the positions: that is the
  gradient of the batch's mean loss, as in one process.
- The sum is explicit (flattened gradients, one all-reduce per bucket) rather than
  ``DistributedDataParallel``'s backward hooks: a step here may run several backward passes
  (``batch_parts``) and a model may step several times a batch (``updates_per_batch``, from a
  generator rather than ``forward``), which DDP's reducer, tied to its module's ``forward``,
  does not follow. The price is that communication does not overlap the backward pass.
- Validation and the test are shared: each rank ranks every P-th chunk of the users and the
  ranks are summed (``seqrec.evaluation.EvalShare``; sampled negatives are drawn as in one
  process), so every rank computes the same metrics and takes the same early-stopping
  decision. Every file of the run directory is rank 0's, and so is the clock of
  ``time_budget_minutes``. After every epoch the ranks check that their weights are still
  identical.

The backend is NCCL when training on CUDA (each rank on GPU ``LOCAL_RANK``), gloo on CPU, where
two processes on one machine also test all of it. Across machines the run directory must be
on a file system every node sees (a resume reads its checkpoint on every rank).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt
import torch
import torch.distributed as dist
from torch import Tensor, nn

from seqrec.config import ConfigError
from seqrec.data.schema import DataError
from seqrec.evaluation import EvalShare
from seqrec.training.launch import launched_rank, launched_world_size

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Gradient elements per flattened all-reduce: enough to amortise a collective's latency
# over many small tensors. A tensor this large or larger is reduced in place, on its own.
BUCKET_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class DataParallel:
    """The ranks of a training run. One process is a group of one: every collective is then
    a no-op, so the training loop has one code path."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that logs and writes the run directory."""
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        """The first rank of its machine: the one that prepares the data there."""
        return self.local_rank == 0

    def device(self, device: torch.device) -> torch.device:
        """This rank's device: its own GPU when training on CUDA with several ranks."""
        if self.world_size > 1 and device.type == "cuda":
            return torch.device("cuda", self.local_rank)
        return device

    def local_main_first(self, work: Callable[[], T]) -> T:
        """``work()`` on every rank, on each machine's first rank before the others (data
        preparation: one process per machine downloads and fills the cache, the others read
        it)."""
        if self.world_size == 1:
            return work()
        value, error = _attempt(work) if self.is_local_main else (None, None)
        self._raise_if_any_failed(error, "preparing the data")  # waits for every first rank
        if not self.is_local_main:
            value, error = _attempt(work)
        self._raise_if_any_failed(error, "reading the data")
        return cast(T, value)

    def _raise_if_any_failed(self, error: Exception | None, what: str) -> None:
        """Every rank learns whether any rank failed and raises then, so that none waits for
        the others at its next collective until the timeout."""
        failed = self.sum_floats([int(error is not None)])[0]
        if error is not None:
            raise error
        if failed:
            raise DataError(f"another rank failed while {what}; its own error says why")

    def from_main(self, value: Callable[[], T]) -> T:
        """``value()`` computed on rank 0 only and sent to every rank."""
        if self.world_size == 1:
            return value()
        box = [value() if self.is_main else None]
        dist.broadcast_object_list(box, src=0, device=self._collective_device())
        return cast(T, box[0])

    def broadcast(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank (a picklable Python object)."""
        return self.from_main(lambda: obj)

    def agree(self, value: int, what: str) -> None:
        """Raise on every rank unless every rank holds the same ``value``."""
        if self.world_size == 1:
            return
        local = torch.tensor([value], dtype=torch.int64, device=self._collective_device())
        gathered = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(gathered, local)
        values = [int(t.item()) for t in gathered]
        if len(set(values)) > 1:
            raise RuntimeError(
                f"the ranks disagree on {what} ({', '.join(map(str, values))} on ranks "
                f"0..{self.world_size - 1}): on several machines the run directory must be on "
                "a file system every machine sees"
            )

    def sum_floats(self, values: Sequence[float]) -> list[float]:
        """Each value summed over the ranks, in float64."""
        if self.world_size == 1:
            return list(values)
        tensor = torch.tensor(list(values), dtype=torch.float64, device=self._collective_device())
        dist.all_reduce(tensor)
        return [float(v) for v in tensor.tolist()]

    def sum_dicts(self, values: dict[str, float]) -> dict[str, float]:
        """Key-wise sums over the ranks of dicts whose keys may differ between ranks."""
        if self.world_size == 1:
            return dict(values)
        gathered: list[dict[str, float] | None] = [None] * self.world_size
        dist.all_gather_object(gathered, values)
        total: dict[str, float] = {}
        for part in gathered:
            for key, value in (part or {}).items():
                total[key] = total.get(key, 0.0) + value
        return total

    def evaluation_share(self) -> EvalShare | None:
        """This rank's share of an evaluation's users (None in one process: all of them)."""
        if self.world_size == 1:
            return None
        return EvalShare(index=self.rank, count=self.world_size, add_up=self._sum_array)

    def _sum_array(self, values: npt.NDArray[Any]) -> npt.NDArray[Any]:
        tensor = torch.from_numpy(np.array(values)).to(self._collective_device())  # a copy
        dist.all_reduce(tensor)
        summed: npt.NDArray[Any] = tensor.cpu().numpy()
        return summed

    def broadcast_module(self, module: nn.Module) -> None:
        """Rank 0's parameters and buffers on every rank (every rank builds the model from
        the same seed; this makes the start identical whatever a model's initialiser does)."""
        if self.world_size == 1:
            return
        with torch.no_grad():
            for tensor in module.state_dict().values():
                dist.broadcast(tensor, src=0)

    def sum_gradients(self, parameters: Sequence[Tensor]) -> None:
        """Sum every parameter's gradient over the ranks, in place. A parameter with no
        gradient on some rank (it had no rows in the step) counts as zero there; one with no
        gradient on any rank keeps none, as in one process."""
        if self.world_size == 1:
            return
        device = parameters[0].device if parameters else self._collective_device()
        has_grad = torch.tensor(
            [p.grad is not None for p in parameters], dtype=torch.int32, device=device
        )
        dist.all_reduce(has_grad)
        reduced = [p for p, n in zip(parameters, has_grad.tolist(), strict=True) if n > 0]
        for p in reduced:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        for bucket in _buckets(reduced):
            grads = [p.grad for p in bucket if p.grad is not None]
            if len(grads) == 1 and grads[0].is_contiguous():  # no flattened copy
                dist.all_reduce(grads[0])
                continue
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()

    def check_replicas(self, module: nn.Module) -> None:
        """Raise when the ranks' weights differ: their updates were not the same."""
        if self.world_size == 1:
            return
        with torch.no_grad():
            local = torch.stack([p.sum(dtype=torch.float64) for p in module.parameters()])
        gathered = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(gathered, local)
        if any(not torch.equal(gathered[0], other) for other in gathered[1:]):
            raise RuntimeError(
                "the ranks' weights differ after an epoch: their gradient updates were not "
                "the same (a nondeterministic optimizer, or a parameter changed outside it)"
            )

    def _collective_device(self) -> torch.device:
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")


SINGLE_PROCESS = DataParallel()


def _attempt(work: Callable[[], T]) -> tuple[T | None, Exception | None]:
    try:
        return work(), None
    except Exception as err:  # raised again on this rank once every rank knows
        return None, err


def _buckets(parameters: Sequence[Tensor]) -> Iterator[list[Tensor]]:
    """Consecutive parameters of one dtype and device, about ``BUCKET_ELEMENTS`` at a time."""
    bucket: list[Tensor] = []
    size = 0
    for p in parameters:
        if bucket and (
            size + p.numel() > BUCKET_ELEMENTS
            or (p.dtype, p.device) != (bucket[0].dtype, bucket[0].device)
        ):
            yield bucket
            bucket, size = [], 0
        bucket.append(p)
        size += p.numel()
    if bucket:
        yield bucket


@contextmanager
def data_parallel(
    device: str, timeout: timedelta = timedelta(minutes=60)
) -> Iterator[DataParallel]:
    """The process group torchrun set up this process for (``SINGLE_PROCESS`` when it was
    not launched by torchrun), joined on entry and left on exit. A group the caller already
    initialised is used and left to the caller. ``timeout``: how long a collective waits
    for the other ranks (NCCL's default, 10 minutes, is shorter than a first download)."""
    world_size = launched_world_size()
    if world_size == 1:
        yield SINGLE_PROCESS
        return
    rank = launched_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    owned = not dist.is_initialized()
    if owned:
        cuda = device in ("cuda", "auto") and torch.cuda.is_available()
        if cuda and local_rank >= torch.cuda.device_count():
            raise ConfigError(
                f"torchrun started more processes on this machine than it has GPUs "
                f"({torch.cuda.device_count()}): use --nproc-per-node "
                f"{torch.cuda.device_count()}, or train.device: cpu"
            )
        if cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timeout)
    elif dist.get_world_size() != world_size or dist.get_rank() != rank:
        raise RuntimeError("the initialised process group is not the one torchrun launched")
    group = DataParallel(rank=rank, world_size=world_size, local_rank=local_rank)
    logger.info("data-parallel: rank %d of %d (%s)", rank, world_size, dist.get_backend())
    try:
        yield group
    except BaseException:
        if owned:  # no barrier: the other ranks may never get there
            dist.destroy_process_group()
        raise
    if owned:
        # Leave together: a rank that tore gloo down while another still used its connection
        # was seen to abort at exit ("terminate called without an active exception").
        dist.barrier()
        dist.destroy_process_group()
