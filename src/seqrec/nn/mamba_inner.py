"""A Mamba block on CPU as one autograd function, with the numba kernels: everything from
the in-projection to the out-projection, both included.

    x, z = hidden W_in  (the two halves of xz)
    u = real * SiLU(causal depthwise conv(x) + b)
    dt, B, C = u W_x;  Delta = real * softplus(dt W_dt + b_dt)
    y = selective_scan(u, Delta, A = -exp(A_log), B, C, D)
    out = (y * SiLU(z)) W_out

It computes what ``seqrec.models.mamba4rec.MambaBlock`` computes with ``scan: numba`` op by op
(the same scan kernel), at a fraction of the memory: autograd would keep about a dozen
(B, L, E*D) tensors for the backward pass (xz, the conv output, u, its transposed copies,
Delta before and after the softplus, y, SiLU(z), the gated product, ...). This keeps y, the
low-rank dt, B, C and the scan's segment states, and recomputes xz, u and Delta in the
backward pass (a D x 2C product, a K-tap conv and a rank-R product: cheap next to the
scan). The idea is mamba-ssm's ``mamba_inner_fn``; the backward pass is written out below.

Shapes: B batch, L length, D the model width, C = E*D the block's inner width, N the state
size, R the rank of dt, K the conv width.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from seqrec.nn.selective_scan import numba_available, numba_turn, numpy_views


def fused_block_applies(hidden: Tensor) -> bool:
    """Whether ``mamba_inner_numba`` can run on this block input: numba installed, a float32
    CPU tensor."""
    return numba_available() and not hidden.is_cuda and hidden.dtype == torch.float32


def mamba_inner_numba(
    hidden: Tensor,
    real: Tensor,
    in_proj_weight: Tensor,
    conv_weight: Tensor,
    conv_bias: Tensor | None,
    x_proj_weight: Tensor,
    dt_proj_weight: Tensor,
    dt_proj_bias: Tensor,
    A_log: Tensor,
    D: Tensor,
    out_proj_weight: Tensor,
) -> Tensor:
    """(B, L, D) block input (zero at padded positions), real (B, L) -> (B, L, D) block output.
    The weights are those of mamba-ssm's ``Mamba`` without biases in the projections:
    in_proj (2C, D), conv (C, 1, K) and (C,), x_proj (R + 2N, C), dt_proj (C, R) and (C,),
    A_log (C, N), D (C,), out_proj (D, C)."""
    if not fused_block_applies(hidden):
        raise ValueError("mamba_inner_numba needs numba and float32 CPU tensors")
    bias = conv_bias if conv_bias is not None else hidden.new_zeros(D.numel())
    with torch.autocast("cpu", enabled=False):  # the kernels take float32 only
        out: Tensor = _MambaInner.apply(  # type: ignore[no-untyped-call]
            hidden.contiguous(),
            real.to(hidden.dtype).contiguous(),
            in_proj_weight,
            conv_weight,
            bias,
            x_proj_weight,
            dt_proj_weight,
            dt_proj_bias,
            A_log,
            D,
            out_proj_weight,
        )
    return out


def _flat(x: Tensor) -> Tensor:
    return x.reshape(-1, x.size(-1))


def _dt_pre(low: Tensor, weight: Tensor, bias: Tensor, out: Tensor) -> Tensor:
    """low W^T + b into ``out`` (B, L, C): Delta before its softplus and padding mask."""
    assert out.is_contiguous()  # else the flat view below would be a copy
    torch.addmm(bias, _flat(low), weight.T, out=_flat(out))
    return out


def _delta(low: Tensor, weight: Tensor, bias: Tensor, real: Tensor, out: Tensor) -> Tensor:
    """Delta = real * softplus(low W^T + b) into ``out`` (B, L, C)."""
    pre = _dt_pre(low, weight, bias, out)
    return torch.logaddexp(pre, pre.new_zeros(()), out=pre).mul_(real.unsqueeze(-1))


def _conv_silu(xz: Tensor, weight: Tensor, bias: Tensor, real: Tensor, out: Tensor) -> Tensor:
    """u into ``out`` (B, L, C) from xz (B, L, 2C), the conv taps (K, C) and bias (C,)."""
    assert out.is_contiguous()  # else the kernel would write into a copy
    with numba_turn() as kernel:
        kernel.conv_silu_forward(*numpy_views(xz, weight, bias, real, out))
    return out


class _MambaInner(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        real: Tensor,
        in_proj_weight: Tensor,
        conv_weight: Tensor,
        conv_bias: Tensor,
        x_proj_weight: Tensor,
        dt_proj_weight: Tensor,
        dt_proj_bias: Tensor,
        A_log: Tensor,
        D: Tensor,
        out_proj_weight: Tensor,
    ) -> Tensor:
        rows, length, _ = hidden.shape
        channels, state = A_log.shape
        rank = dt_proj_weight.size(1)
        xz = torch.mm(_flat(hidden), in_proj_weight.T).view(rows, length, -1)  # (B, L, 2C)
        taps = conv_weight[:, 0].T.contiguous()  # (K, C)
        u = _conv_silu(xz, taps, conv_bias, real, out=xz.new_empty(rows, length, channels))
        proj = torch.mm(_flat(u), x_proj_weight.T).view(rows, length, -1)  # (B, L, R + 2N)
        low, B, C = (p.contiguous() for p in torch.split(proj, [rank, state, state], dim=-1))
        delta = _delta(low, dt_proj_weight, dt_proj_bias, real, out=torch.empty_like(u))
        At = (-torch.exp(A_log)).T.contiguous()  # (N, C)
        with numba_turn() as kernel:
            y = torch.empty_like(u)
            starts = xz.new_empty(rows, -(-length // kernel.SEGMENT), state, channels)
            last = xz.new_empty(rows, state, channels)
            kernel.scan_forward(*numpy_views(u, delta, At, B, C, D, y, starts, last))
        gated = torch.mul(F.silu(xz[..., channels:], inplace=False), y, out=delta)
        out = torch.mm(_flat(gated), out_proj_weight.T).view(rows, length, -1)
        ctx.save_for_backward(
            hidden,
            real,
            in_proj_weight,
            taps,
            conv_bias,
            x_proj_weight,
            dt_proj_weight,
            dt_proj_bias,
            At,
            D,
            out_proj_weight,
            low,
            B,
            C,
            y,
            starts,
        )
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        (
            hidden,
            real,
            in_proj_weight,
            taps,
            conv_bias,
            x_proj_weight,
            dt_proj_weight,
            dt_proj_bias,
            At,
            D,
            out_proj_weight,
            low,
            B,
            C,
            y,
            starts,
        ) = ctx.saved_tensors
        rows, length, _ = hidden.shape
        state, channels = At.shape
        g_out = _flat(grad_out.float())  # (B L, D)
        xz = torch.mm(_flat(hidden), in_proj_weight.T).view(rows, length, -1)  # (B, L, 2C)
        # At long histories every fresh (B, L, C) buffer costs page faults worth several
        # elementwise passes, so dead buffers are reused below (``out=``, in place).
        g_xz = torch.empty_like(xz)
        scratch = g_xz.view(-1, 2 * channels)[:, :channels]  # its x half, until the conv's turn
        g_z = g_xz[..., channels:]

        # out = gated W_out^T, gated = y * SiLU(z)
        z = xz[..., channels:]
        sig_z = torch.sigmoid(z)
        silu_z = z * sig_z
        g_out_proj = torch.mm(g_out.T, torch.mul(_flat(y), _flat(silu_z), out=scratch))  # (D, C)
        g_gated = torch.mm(g_out, out_proj_weight).view(rows, length, channels)
        # dL/dz = g_gated * y * SiLU'(z), SiLU'(z) = sigma(z) + SiLU(z) (1 - sigma(z))
        silu_grad = torch.mul(_flat(silu_z), _flat(sig_z), out=scratch).view_as(g_z)
        silu_grad = torch.sub(silu_z, silu_grad, out=silu_grad).add_(sig_z)
        torch.mul(silu_grad, y, out=g_z).mul_(g_gated)
        g_y = g_gated.mul_(silu_z)

        # The scan, from u and Delta recomputed into the buffers of SiLU(z) and sigma(z).
        # dL/du overwrites dL/dy (the kernel allows it).
        u = _conv_silu(xz, taps, conv_bias, real, out=sig_z)
        delta = _delta(low, dt_proj_weight, dt_proj_bias, real, out=silu_z)
        del sig_z, silu_z
        g_u, g_delta = g_y, torch.empty_like(u)
        g_A_rows = xz.new_empty(rows, state, channels)
        g_B, g_C = torch.empty_like(B), torch.empty_like(C)
        g_D_rows = xz.new_empty(rows, channels)
        no_grad_last = xz.new_zeros(rows, state, channels)  # the last state is not an output
        with numba_turn() as kernel:
            kernel.scan_backward(
                *numpy_views(u, delta, At, B, C, D, starts, g_y, no_grad_last),
                *numpy_views(g_u, g_delta, g_A_rows, g_B, g_C, g_D_rows),
            )

        # Delta = real * softplus(pre), pre = low W_dt^T + b_dt: softplus' = sigma
        sig_pre = _dt_pre(low, dt_proj_weight, dt_proj_bias, out=delta).sigmoid_()
        g_pre = _flat(g_delta.mul_(sig_pre).mul_(real.unsqueeze(-1)))  # (B L, C)
        del delta, sig_pre
        g_dt_proj = torch.mm(_flat(low).T, g_pre).T  # (C, R); as g_pre^T low, BLAS is 20x slower
        g_dt_bias = g_pre.sum(0)
        g_proj = torch.cat([torch.mm(g_pre, dt_proj_weight).view_as(low), g_B, g_C], dim=-1)
        del g_pre, g_delta
        # proj = u W_x^T
        g_x_proj = torch.mm(_flat(g_proj).T, _flat(u))  # (R + 2N, C)
        _flat(g_u).addmm_(_flat(g_proj), x_proj_weight)
        del g_proj

        # u = real * SiLU(conv(x) + b): fills the x half of g_xz
        g_taps_rows = xz.new_empty(rows, taps.size(0), channels)
        g_bias_rows = xz.new_empty(rows, channels)
        with numba_turn() as kernel:
            kernel.conv_silu_backward(
                *numpy_views(xz, taps, conv_bias, real, g_u, g_xz, g_taps_rows, g_bias_rows)
            )
        g_conv = g_taps_rows.sum(0).T.unsqueeze(1)  # (C, 1, K)
        del xz, u
        # xz = hidden W_in^T
        g_in_proj = torch.mm(_flat(g_xz).T, _flat(hidden))  # (2C, D)
        g_hidden = torch.mm(_flat(g_xz), in_proj_weight).view_as(hidden)
        # A = -exp(A_log): dA/dA_log = A
        g_A_log = (g_A_rows.sum(0) * At).T
        return (
            g_hidden,
            None,
            g_in_proj,
            g_conv,
            g_bias_rows.sum(0),
            g_x_proj,
            g_dt_proj,
            g_dt_bias,
            g_A_log,
            g_D_rows.sum(0),
            g_out_proj,
        )
