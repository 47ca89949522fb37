"""A position-wise feed-forward block with its residual, as one autograd function that goes
through the positions a chunk at a time:

    out = x + Dropout(Dropout(GELU(x W1^T + b1)) W2^T + b2)

Autograd over these operations keeps four (B, L, 4D) tensors for the backward pass (the
first product, its GELU, the dropout mask and the dropped activations); at long histories
they are most of a training step's memory. This keeps nothing but ``x``: the backward pass
recomputes the product and the GELU one chunk of positions at a time, and draws the same
dropout masks again. The masks are ``seqrec.nn.hashed_dropout``'s, a hash of each element's
index under a key per chunk and mask (from one seed per call, drawn from torch's generator, so
``torch.manual_seed`` still fixes a run): applying one is a single pass over the activations,
where drawing one from a generator, converting it and scaling took four.

CPU, float32, outside autocast: elsewhere the caller runs the operations themselves.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from seqrec.nn.hashed_dropout import drop_threshold, hashed_dropout_, stream_key

CHUNK_POSITIONS = 8192  # a chunk's (positions, 4D) temporaries are 8 MiB at D = 64


def fused_ffn_applies(x: Tensor) -> bool:
    """Whether ``gelu_ffn_residual`` takes this input: float32 on CPU, no autocast."""
    cpu_float32 = x.device.type == "cpu" and x.dtype == torch.float32
    return cpu_float32 and not torch.is_autocast_enabled("cpu")


def gelu_ffn_residual(
    x: Tensor,
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
    p: float,
    training: bool,
    chunk_positions: int = CHUNK_POSITIONS,
) -> Tensor:
    """(..., D) -> x + Dropout(Dropout(GELU(x W1^T + b1)) W2^T + b2), both dropouts with
    probability ``p`` when ``training``; W1 (H, D), b1 (H,), W2 (D, H), b2 (D,)."""
    if not fused_ffn_applies(x):
        raise ValueError("gelu_ffn_residual needs a float32 CPU tensor outside autocast")
    if chunk_positions < 1:
        raise ValueError(f"chunk_positions must be >= 1, got {chunk_positions}")
    p = p if training else 0.0
    drop_threshold(p)  # checks p
    seed = int(torch.randint(0, 2**62, ()).item()) if p > 0.0 else 0
    flat = x.reshape(-1, x.size(-1))
    out: Tensor = _GeluFFN.apply(flat, w1, b1, w2, b2, p, seed, chunk_positions)  # type: ignore[no-untyped-call]
    return out.view_as(x)


def _chunks(positions: int, chunk: int) -> Iterator[tuple[int, slice]]:
    """(index, rows) of each chunk of ``chunk`` positions, the index keying its masks."""
    return enumerate(slice(start, start + chunk) for start in range(0, positions, chunk))


INNER_MASK, OUTER_MASK = 0, 1  # the streams of a chunk's two masks: (rows, H) and (rows, D)


class _GeluFFN(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        w1: Tensor,
        b1: Tensor,
        w2: Tensor,
        b2: Tensor,
        p: float,
        seed: int,
        chunk_positions: int,
    ) -> Tensor:
        out = torch.empty_like(x)
        for index, rows in _chunks(x.size(0), chunk_positions):
            x_c = x[rows]
            inner, outer = (stream_key(seed, index, mask) for mask in (INNER_MASK, OUTER_MASK))
            hidden = hashed_dropout_(F.gelu(torch.addmm(b1, x_c, w1.T)), inner, p)
            mixed = hashed_dropout_(torch.addmm(b2, hidden, w2.T), outer, p)
            torch.add(x_c, mixed, out=out[rows])
        ctx.save_for_backward(x, w1, b1, w2)
        ctx.p, ctx.seed, ctx.chunk_positions = p, seed, chunk_positions
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, w1, b1, w2 = ctx.saved_tensors
        p = ctx.p
        g_x = grad.clone(memory_format=torch.contiguous_format)  # the residual's share
        g_w1, g_b1 = torch.zeros_like(w1), torch.zeros_like(b1)
        g_w2, g_b2 = torch.zeros_like(w2), w2.new_zeros(w2.size(0))
        for index, rows in _chunks(x.size(0), ctx.chunk_positions):
            x_c = x[rows]
            inner, outer = (stream_key(ctx.seed, index, m) for m in (INNER_MASK, OUTER_MASK))
            pre = torch.addmm(b1, x_c, w1.T)
            hidden = hashed_dropout_(F.gelu(pre), inner, p)  # as in the forward pass
            g_out = grad[rows]  # copied before masking: the residual's share is read from it too
            g_mixed = g_out if p == 0.0 else g_out.clone(memory_format=torch.contiguous_format)
            g_mixed = hashed_dropout_(g_mixed, outer, p)
            g_w2.addmm_(g_mixed.T, hidden)
            g_b2.add_(g_mixed.sum(0))
            g_hidden = hashed_dropout_(torch.mm(g_mixed, w2), inner, p)
            g_pre = torch.ops.aten.gelu_backward(g_hidden, pre)
            g_w1.addmm_(g_pre.T, x_c)
            g_b1.add_(g_pre.sum(0))
            g_x[rows].addmm_(g_pre, w1)
        return g_x, g_w1, g_b1, g_w2, g_b2, None, None, None
