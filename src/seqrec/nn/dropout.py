"""Dropout whose mask is cheap to draw on CPU.

``F.dropout`` draws one Bernoulli sample per element through the CPU generator, which
dominates a SASRec training step on CPU (about a third of it at the paper's ML-1M
settings). Here each 64-bit integer from the same seeded generator gives four 16-bit
uniform draws, so a mask costs a sixth of the time. The drop probability is rounded to a
multiple of 1/65536 (0.2 becomes 0.199997) and the survivors are scaled by the exact inverse
of the realised keep probability, so the expectation is unchanged. On other devices, and
as the reference, this is ``F.dropout``.

The masking is its own autograd function: ``x * keep`` then an in-place scale, forward and
backward alike, where autograd over ``torch.where(keep, x * scale, 0)`` allocates two
tensors each way; at long histories those allocations cost more than the arithmetic. The
mask is 0/1 ``uint8``, not bool: on CPU, multiplying a float tensor by a bool tensor (or
``masked_fill`` with one) is 5-10x slower than by the same bytes read as ``uint8``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_LEVELS = 1 << 16


def keep_mask(
    shape: torch.Size | tuple[int, ...],
    p: float,
    device: torch.device,
    generator: torch.Generator | None = None,
) -> Tensor:
    """A 0/1 ``uint8`` mask, 1 with probability 1 - round(p * 2^16) / 2^16, from ``generator``
    (by default torch's)."""
    n = math.prod(shape)
    # One 64-bit draw per four elements, each read as a uniform int16 in [-2^15, 2^15).
    draws = torch.empty((n + 3) // 4, dtype=torch.int64, device=device)
    draws.random_(-(1 << 63), (1 << 63) - 1, generator=generator)
    threshold = round(p * _LEVELS) - _LEVELS // 2
    return (draws.view(torch.int16)[:n] >= threshold).view(torch.uint8).view(shape)


class _ScaledMask(torch.autograd.Function):
    """x * keep * scale, keeping only the 0/1 mask for backward."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, x: Tensor, keep: Tensor, scale: float
    ) -> Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale  # type: ignore[attr-defined]
        return x.mul(keep).mul_(scale)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: Tensor
    ) -> tuple[Tensor, None, None]:
        (keep,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return grad.mul(keep).mul_(ctx.scale), None, None  # type: ignore[attr-defined]


def keep_scale(p: float) -> float:
    """What ``keep_mask``'s survivors are multiplied by: the inverse of their probability."""
    return 1.0 / (1.0 - round(p * _LEVELS) / _LEVELS)


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Drop-in for ``F.dropout`` (not in place)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, training=True)
    keep = keep_mask(x.shape, p, x.device)
    out: Tensor = _ScaledMask.apply(x, keep, keep_scale(p))  # type: ignore[no-untyped-call]
    return out


class Dropout(nn.Module):
    """``nn.Dropout`` with the CPU-friendly mask of ``dropout``."""

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
