"""A linear layer whose float32 CPU products run through oneDNN instead of the BLAS.

torch's CPU build sends a float32 ``F.linear`` to MKL's sgemm, which on this project's
AMD (Zen 4) cores is slow for some shapes: one thread computed RecRec's SwiGLU input
product, (4096, 64) x (64, 170), at a median 26 GFLOP/s against 51 for oneDNN's matmul, and
SASRec's query-key-value product, (6400, 50) x (50, 150), at 20 against 48
(``benchmarks/linear_kernels.py`` prints the table for the machine it runs on). oneDNN
computes the forward product and the input gradient; the weight gradient ``dY^T X`` stays
with MKL, which was the faster there (52 against 35 at the SwiGLU's shape). The values are
float32 products either way, summed in another order. RecRec's layers use it (a stage-2
step 7% faster on one thread); SASRec's gained nothing measurable end to end and keep
``nn.Linear``.

CPU, float32, outside autocast and with oneDNN present: elsewhere ``Linear`` is
``nn.Linear``.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# The op torch's compiler uses for CPU linear layers; None in builds without oneDNN.
ONEDNN_PRODUCT: Any = None
if torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
    with contextlib.suppress(AttributeError, RuntimeError):
        ONEDNN_PRODUCT = torch.ops.mkldnn._linear_pointwise


def onednn_linear_applies(x: Tensor, weight: Tensor) -> bool:
    """Whether ``onednn_linear`` takes these tensors: float32 on CPU, no autocast, oneDNN."""
    cpu_float32 = all(t.device.type == "cpu" and t.dtype == torch.float32 for t in (x, weight))
    return cpu_float32 and not torch.is_autocast_enabled("cpu") and ONEDNN_PRODUCT is not None


def onednn_product(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """(M, K) x (N, K)^T + (N,) -> (M, N) by oneDNN."""
    return ONEDNN_PRODUCT(x, weight, bias, "none", [], "")


def product_flops(x: list[int], weight: list[int], *args: Any, **kwargs: Any) -> int:
    """``ONEDNN_PRODUCT``'s FLOPs from its shapes, for ``torch.utils.flop_counter``."""
    return 2 * math.prod(x) * weight[0]


def onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear`` computed by oneDNN: (..., K), (N, K), (N,) -> (..., N)."""
    if not onednn_linear_applies(x, weight):
        raise ValueError("onednn_linear needs float32 CPU tensors outside autocast and oneDNN")
    return _onednn_linear(x, weight, bias)


def _onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    flat = x.reshape(-1, x.size(-1))
    out: Tensor = _OneDnnLinear.apply(flat, weight, bias)  # type: ignore[no-untyped-call]
    return out.view(*x.shape[:-1], weight.size(0))


class _OneDnnLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return onednn_product(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = onednn_product(grad, weight.t().contiguous(), None)  # dY W
        if ctx.needs_input_grad[1]:
            grad_weight = grad.t() @ x  # dY^T X
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum(dim=0)
        return grad_x, grad_weight, grad_bias


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``onednn_linear`` where that applies, else ``F.linear``."""
    if onednn_linear_applies(x, weight):
        return _onednn_linear(x, weight, bias)
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state dict) computed by ``linear``."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)
