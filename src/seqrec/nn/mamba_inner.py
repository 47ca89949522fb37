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
Delta before and after the softplus, B, C, y, SiLU(z), the gated product, ...). This keeps y
and the scan's segment states, and recomputes xz, u, dt, B, C and Delta in the backward pass
(a D x 2C product, a K-tap conv and two thin products: cheap next to the scan). The idea is
mamba-ssm's ``mamba_inner_fn``; the backward pass is written out below.

Both passes also go through the batch a few users at a time (every user's sequence is
independent): the temporaries then cost a chunk's worth of memory, not the batch's, which is
what bounds the peak at long histories.

Shapes: B batch, L length, D the model width, C = E*D the block's inner width, N the state
size, R the rank of dt, K the conv width.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from seqrec.nn.selective_scan import numba_available, numba_turn, numpy_views

# (user, position) pairs per chunk: a chunk's (B, L, 2C) temporary is then 16 MiB at C = 128.
CHUNK_POSITIONS = 16384


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
    chunk_positions: int = CHUNK_POSITIONS,
    newest_only: bool = False,
) -> Tensor:
    """(B, L, D) block input (zero at padded positions), real (B, L) -> (B, L, D) block output,
    or (B, 1, D) for the newest position with ``newest_only`` (scoring: without a gradient
    to compute, the gate and out-projection then run on that position alone).
    The weights are those of mamba-ssm's ``Mamba`` without biases in the projections:
    in_proj (2C, D), conv (C, 1, K) and (C,), x_proj (R + 2N, C), dt_proj (C, R) and (C,),
    A_log (C, N), D (C,), out_proj (D, C). The batch is processed about ``chunk_positions``
    (user, position) pairs at a time."""
    if not fused_block_applies(hidden):
        raise ValueError("mamba_inner_numba needs numba and float32 CPU tensors")
    if chunk_positions < 1:
        raise ValueError(f"chunk_positions must be >= 1, got {chunk_positions}")
    bias = conv_bias if conv_bias is not None else hidden.new_zeros(D.numel())
    weights = [in_proj_weight, conv_weight, bias, x_proj_weight, dt_proj_weight, dt_proj_bias]
    weights += [A_log, D, out_proj_weight]
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in [hidden, *weights])
    if newest_only and not needs_grad:
        with torch.autocast("cpu", enabled=False):
            contiguous = (hidden.contiguous(), real.to(hidden.dtype).contiguous())
            return _newest_outputs(*contiguous, chunk_positions, *weights)
    with torch.autocast("cpu", enabled=False):  # the kernels take float32 only
        out: Tensor = _MambaInner.apply(  # type: ignore[no-untyped-call]
            hidden.contiguous(), real.to(hidden.dtype).contiguous(), chunk_positions, *weights
        )
    return out[:, -1:] if newest_only else out


@dataclass(frozen=True)
class _Weights:
    """The block's parameters in the layouts the passes use."""

    in_proj: Tensor  # (2C, D)
    taps: Tensor  # (K, C), the conv's
    conv_bias: Tensor  # (C,)
    x_proj: Tensor  # (R + 2N, C)
    dt_proj: Tensor  # (C, R)
    dt_bias: Tensor  # (C,)
    At: Tensor  # (N, C), A = -exp(A_log) transposed
    D: Tensor  # (C,)
    out_proj: Tensor  # (D, C)

    @property
    def channels(self) -> int:
        return self.At.size(1)

    @property
    def state(self) -> int:
        return self.At.size(0)

    @property
    def rank(self) -> int:
        return self.dt_proj.size(1)


@dataclass
class _Grads:
    """Weight gradients summed over the chunks, in ``_Weights``' layouts except dt_proj's,
    kept transposed (R, C)."""

    in_proj: Tensor
    taps: Tensor
    conv_bias: Tensor
    x_proj: Tensor
    dt_proj_T: Tensor
    dt_bias: Tensor
    At: Tensor  # d loss / d A, (N, C)
    D: Tensor
    out_proj: Tensor

    @staticmethod
    def zeros(w: _Weights) -> _Grads:
        shapes = {f.name: getattr(w, f.name).shape for f in fields(_Weights)}
        shapes["dt_proj_T"] = w.dt_proj.T.shape
        del shapes["dt_proj"]
        return _Grads(**{name: w.D.new_zeros(shape) for name, shape in shapes.items()})


def _block_weights(
    in_proj_weight: Tensor,
    conv_weight: Tensor,
    conv_bias: Tensor,
    x_proj_weight: Tensor,
    dt_proj_weight: Tensor,
    dt_proj_bias: Tensor,
    A_log: Tensor,
    D: Tensor,
    out_proj_weight: Tensor,
) -> _Weights:
    return _Weights(
        in_proj=in_proj_weight,
        taps=conv_weight[:, 0].T.contiguous(),
        conv_bias=conv_bias,
        x_proj=x_proj_weight,
        dt_proj=dt_proj_weight,
        dt_bias=dt_proj_bias,
        At=(-torch.exp(A_log)).T.contiguous(),
        D=D,
        out_proj=out_proj_weight,
    )


def _segments(length: int) -> int:
    """Segment states the scan keeps for a sequence of ``length`` steps."""
    with numba_turn() as kernel:
        return -(-length // kernel.SEGMENT)


def _newest_outputs(hidden: Tensor, real: Tensor, chunk_positions: int, *weights: Tensor) -> Tensor:
    """The block's (B, 1, D) output at the newest position, with no gradient: y and the
    segment states are a chunk's scratch, and only the newest position is gated and
    projected out."""
    w = _block_weights(*weights)
    rows, length, width = hidden.shape
    segments = _segments(length)
    out = hidden.new_empty(rows, 1, width)
    for part in _chunks(rows, length, chunk_positions):
        users = hidden[part]
        y = users.new_empty(users.size(0), length, w.channels)
        starts = users.new_empty(users.size(0), segments, w.state, w.channels)
        _forward_rows(w, users, real[part], y, starts, out[part])
    return out


def _flat(x: Tensor) -> Tensor:
    return x.reshape(-1, x.size(-1))


def _chunks(rows: int, length: int, chunk_positions: int) -> list[slice]:
    """Slices of the batch of about ``chunk_positions`` positions each; never fewer users than
    threads, as the kernels split a chunk's users between the threads."""
    threads = max(1, torch.get_num_threads())
    per_chunk = max(chunk_positions // max(length, 1), 1)
    per_chunk = threads * -(-per_chunk // threads)  # a multiple of the threads
    return [slice(start, min(start + per_chunk, rows)) for start in range(0, rows, per_chunk)]


def _dt_pre(low: Tensor, weight: Tensor, bias: Tensor, out: Tensor) -> Tensor:
    """low W^T + b into ``out`` (B, L, C): Delta before its softplus and padding mask."""
    assert out.is_contiguous()  # else the flat view below would be a copy
    torch.addmm(bias, _flat(low), weight.T, out=_flat(out))
    return out


def _delta(low: Tensor, w: _Weights, real: Tensor, out: Tensor) -> Tensor:
    """Delta = real * softplus(low W^T + b) into ``out`` (B, L, C)."""
    pre = _dt_pre(low, w.dt_proj, w.dt_bias, out)
    return torch.logaddexp(pre, pre.new_zeros(()), out=pre).mul_(real.unsqueeze(-1))


def _conv_silu(xz: Tensor, w: _Weights, real: Tensor, out: Tensor) -> Tensor:
    """u into ``out`` (B, L, C) from xz (B, L, 2C)."""
    assert out.is_contiguous()  # else the kernel would write into a copy
    with numba_turn() as kernel:
        kernel.conv_silu_forward(*numpy_views(xz, w.taps, w.conv_bias, real, out))
    return out


def _in_proj(hidden: Tensor, w: _Weights) -> Tensor:
    """xz = hidden W_in^T: (B, L, 2C)."""
    rows, length, _ = hidden.shape
    return torch.mm(_flat(hidden), w.in_proj.T).view(rows, length, -1)


def _ssm_inputs(u: Tensor, w: _Weights) -> tuple[Tensor, Tensor, Tensor]:
    """u W_x^T split into the low-rank dt (B, L, R), B and C (B, L, N), each contiguous."""
    proj = torch.mm(_flat(u), w.x_proj.T).view(*u.shape[:2], -1)
    low, B, C = (p.contiguous() for p in torch.split(proj, [w.rank, w.state, w.state], dim=-1))
    return low, B, C


def _leading_padding(real: Tensor) -> Any:
    """Each row's count of padded positions before its first real one, (B,) int64 numpy: u
    and Delta are zero there (both are multiplied by ``real``), so the scan skips them."""
    length = real.size(1)
    is_real = real.ne(0)
    first = torch.where(is_real.any(1), is_real.to(torch.uint8).argmax(1), length)
    return first.to(torch.int64).numpy()


def _forward_rows(
    w: _Weights, hidden: Tensor, real: Tensor, y: Tensor, starts: Tensor, out: Tensor
) -> None:
    """The block on some users: fills their y (B, L, C), segment states and output, (B, L, D)
    or (B, 1, D) for the newest position only."""
    rows, length, _ = hidden.shape
    xz = _in_proj(hidden, w)
    u = _conv_silu(xz, w, real, out=xz.new_empty(rows, length, w.channels))
    low, B, C = _ssm_inputs(u, w)
    delta = _delta(low, w, real, out=torch.empty_like(u))
    last = xz.new_empty(rows, w.state, w.channels)
    with numba_turn() as kernel:
        kernel.scan_forward(
            *numpy_views(u, delta, w.At, B, C, w.D, y, starts, last), _leading_padding(real)
        )
    if out.size(1) == 1 < length:  # the newest position only
        xz, y, delta = xz[:, -1:], y[:, -1:], delta[:, -1:]
    gated = torch.mul(F.silu(xz[..., w.channels :], inplace=False), y, out=delta)
    torch.mm(_flat(gated), w.out_proj.T, out=_flat(out))


def _backward_rows(
    w: _Weights,
    acc: _Grads,
    hidden: Tensor,
    real: Tensor,
    y: Tensor,
    starts: Tensor,
    grad_out: Tensor,
    g_hidden: Tensor,
) -> None:
    """The backward pass on some users: fills their g_hidden and adds to ``acc``."""
    rows, length, _ = hidden.shape
    channels, state = w.channels, w.state
    g_out = _flat(grad_out)  # (B L, D)
    xz = _in_proj(hidden, w)
    # At long histories every fresh (B, L, C) buffer costs page faults worth several
    # elementwise passes, so dead buffers are reused below (``out=``, in place).
    g_xz = torch.empty_like(xz)
    scratch = g_xz.view(-1, 2 * channels)[:, :channels]  # its x half, until the conv's turn
    g_z = g_xz[..., channels:]

    # out = gated W_out^T, gated = y * SiLU(z)
    z = xz[..., channels:]
    sig_z = torch.sigmoid(z)
    silu_z = z * sig_z
    acc.out_proj.addmm_(g_out.T, torch.mul(_flat(y), _flat(silu_z), out=scratch))
    g_gated = torch.mm(g_out, w.out_proj).view(rows, length, channels)
    # dL/dz = g_gated * y * SiLU'(z), SiLU'(z) = sigma(z) + SiLU(z) (1 - sigma(z))
    silu_grad = torch.mul(_flat(silu_z), _flat(sig_z), out=scratch).view_as(g_z)
    silu_grad = torch.sub(silu_z, silu_grad, out=silu_grad).add_(sig_z)
    torch.mul(silu_grad, y, out=g_z).mul_(g_gated)
    g_y = g_gated.mul_(silu_z)

    # The scan, from u, B, C and Delta recomputed (u and Delta into the buffers of SiLU(z)
    # and sigma(z)). dL/du overwrites dL/dy (the kernel allows it).
    u = _conv_silu(xz, w, real, out=sig_z)
    low, B, C = _ssm_inputs(u, w)
    delta = _delta(low, w, real, out=silu_z)
    del sig_z, silu_z
    g_u, g_delta = g_y, torch.empty_like(u)
    g_A_rows = xz.new_empty(rows, state, channels)
    g_B, g_C = torch.empty_like(B), torch.empty_like(C)
    g_D_rows = xz.new_empty(rows, channels)
    no_grad_last = xz.new_zeros(rows, state, channels)  # the last state is not an output
    with numba_turn() as kernel:
        kernel.scan_backward(
            *numpy_views(u, delta, w.At, B, C, w.D, starts, g_y, no_grad_last),
            *numpy_views(g_u, g_delta, g_A_rows, g_B, g_C, g_D_rows),
            _leading_padding(real),
        )
    acc.At.add_(g_A_rows.sum(0))
    acc.D.add_(g_D_rows.sum(0))

    # Delta = real * softplus(pre), pre = low W_dt^T + b_dt: softplus' = sigma
    sig_pre = _dt_pre(low, w.dt_proj, w.dt_bias, out=delta).sigmoid_()
    g_pre = _flat(g_delta.mul_(sig_pre).mul_(real.unsqueeze(-1)))  # (B L, C)
    del delta, sig_pre
    acc.dt_proj_T.addmm_(_flat(low).T, g_pre)  # as g_pre^T low, BLAS is 20x slower
    acc.dt_bias.add_(g_pre.sum(0))
    g_proj = torch.cat([torch.mm(g_pre, w.dt_proj).view_as(low), g_B, g_C], dim=-1)
    del g_pre, g_delta
    # proj = u W_x^T
    acc.x_proj.addmm_(_flat(g_proj).T, _flat(u))
    _flat(g_u).addmm_(_flat(g_proj), w.x_proj)
    del g_proj

    # u = real * SiLU(conv(x) + b): fills the x half of g_xz
    g_taps_rows = xz.new_empty(rows, w.taps.size(0), channels)
    g_bias_rows = xz.new_empty(rows, channels)
    with numba_turn() as kernel:
        kernel.conv_silu_backward(
            *numpy_views(xz, w.taps, w.conv_bias, real, g_u, g_xz, g_taps_rows, g_bias_rows)
        )
    acc.taps.add_(g_taps_rows.sum(0))
    acc.conv_bias.add_(g_bias_rows.sum(0))
    del xz, u
    # xz = hidden W_in^T
    acc.in_proj.addmm_(_flat(g_xz).T, _flat(hidden))
    torch.mm(_flat(g_xz), w.in_proj, out=_flat(g_hidden))


class _MambaInner(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, hidden: Tensor, real: Tensor, chunk_positions: int, *weights: Tensor
    ) -> Tensor:
        """``weights``: those of ``_block_weights``, in its order."""
        w = _block_weights(*weights)
        rows, length, width = hidden.shape
        y = hidden.new_empty(rows, length, w.channels)
        starts = hidden.new_empty(rows, _segments(length), w.state, w.channels)
        out = hidden.new_empty(rows, length, width)
        for part in _chunks(rows, length, chunk_positions):
            _forward_rows(w, hidden[part], real[part], y[part], starts[part], out[part])
        ctx.chunk_positions = chunk_positions
        ctx.save_for_backward(hidden, real, y, starts, *(getattr(w, f.name) for f in fields(w)))
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        hidden, real, y, starts, *weights = ctx.saved_tensors
        w = _Weights(*weights)
        rows, length, _ = hidden.shape
        grad_out = grad_out.float()
        acc = _Grads.zeros(w)
        g_hidden = torch.empty_like(hidden)
        for part in _chunks(rows, length, ctx.chunk_positions):
            _backward_rows(
                w, acc, hidden[part], real[part], y[part], starts[part], grad_out[part],
                g_hidden[part],
            )  # fmt: skip
        g_conv = acc.taps.T.unsqueeze(1)  # (C, 1, K)
        g_A_log = (acc.At * w.At).T  # A = -exp(A_log): dA/dA_log = A
        return (
            g_hidden,
            None,
            None,
            acc.in_proj,
            g_conv,
            acc.conv_bias,
            acc.x_proj,
            acc.dt_proj_T.T,
            acc.dt_bias,
            g_A_log,
            acc.D,
            acc.out_proj,
        )
