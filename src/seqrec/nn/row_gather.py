"""A batch's rows gathered over the data-parallel ranks, for losses that couple rows.

Data-parallel training gives every rank a share of each batch's rows. A loss whose terms
each depend on their own row splits over the ranks as it is; a loss that compares a row with
the batch's other rows (DuoRec's InfoNCE, a sampled loss over in-batch negatives) sees the
whole batch only if each rank gathers the others' rows. ``gather_rows`` does that while the
training loop holds ``rows_gathered_over_ranks``; everywhere else (one process, evaluation,
serving) it returns its input.

Gradients flow back to the rank that owns a row: each rank's loss depends on every rank's
rows, so the gradient of a gathered row is summed over the ranks (an all-reduce in the
backward pass) before the rank keeps its own rows' part. Every rank must call ``gather_rows``
the same number of times, in the same order, in its forward pass; so every rank needs rows
in every step (``TrainBatches.rows_on_every_rank``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import FunctionCtx

_GATHERING: ContextVar[bool] = ContextVar("rows_gathered_over_ranks", default=False)


@contextmanager
def rows_gathered_over_ranks(active: bool = True) -> Iterator[None]:
    """While held (and ``active``), ``gather_rows`` gathers over the default process group."""
    token = _GATHERING.set(active)
    try:
        yield
    finally:
        _GATHERING.reset(token)


def gather_rows(rows: Tensor) -> tuple[Tensor, int]:
    """(b, *rest) rows of this rank -> (every rank's rows in rank order, the index of this
    rank's first row among them). Ranks may hold different numbers of rows."""
    if not _GATHERING.get() or not dist.is_initialized() or dist.get_world_size() == 1:
        return rows, 0
    counts = _all_gather(torch.tensor([rows.size(0)], device=rows.device))
    sizes = [int(count) for count in counts]
    widest = max(sizes)
    padding = rows.new_zeros(widest - rows.size(0), *rows.shape[1:])
    padded = torch.cat([rows, padding]).contiguous()
    if padded.requires_grad:
        gathered: Tensor = _GatherWithGradient.apply(padded)  # type: ignore[no-untyped-call]
    else:
        gathered = torch.cat(_all_gather(padded))
    pieces = [gathered[r * widest : r * widest + size] for r, size in enumerate(sizes)]
    return torch.cat(pieces), sum(sizes[: dist.get_rank()])


def _all_gather(tensor: Tensor) -> list[Tensor]:
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(out, tensor)
    return out


class _GatherWithGradient(torch.autograd.Function):
    """All-gather of equal-sized blocks; backward sums the gradient over the ranks and keeps
    this rank's block (an all-reduce: gloo has no reduce-scatter)."""

    @staticmethod
    def forward(ctx: FunctionCtx, block: Tensor) -> Tensor:
        return torch.cat(_all_gather(block))

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        summed = grad.contiguous().clone()
        dist.all_reduce(summed)
        width = summed.size(0) // dist.get_world_size()
        rank = dist.get_rank()
        return summed[rank * width : (rank + 1) * width]
