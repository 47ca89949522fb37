"""The selective scan of Mamba (S6), three ways: a readable reference, a fast CPU path and
the ``mamba-ssm`` CUDA kernel, all with the same signature.

For every channel d and state index n, with the simplified discretisation of Mamba's
reference code (B_bar = Delta B rather than the zero-order hold):

    h_t = exp(Delta_t A) h_{t-1} + Delta_t B_t x_t,    y_t = C_t h_t + D x_t,    h_{-1} = 0

Shapes follow ``mamba_ssm.selective_scan_fn`` (channels before time). In shape comments
B, D, N and L are batch, channels (Mamba's d_inner), state size and length; the arguments
``A``, ``B``, ``C`` and ``D`` are the SSM's parameters:

    u, delta: (B, D, L)   A: (D, N)   B, C: (B, N, L)   D: (D,) or None
    -> y: (B, D, L) and, with ``return_last_state``, h_{L-1}: (B, D, N)

A position with Delta_t = 0 is the identity on the state (exp(0) = 1, no input): that is
how left padding is kept out of the recurrence.

Choosing an implementation (``ScanImpl``): "reference" and "fast" run anywhere; "cuda" needs
CUDA tensors and ``pip install 'seqrec[mamba]'``; "auto" takes the CUDA kernel for CUDA
tensors when it is installed, "fast" otherwise, and logs its choice once.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor

logger = logging.getLogger(__name__)

ScanImpl = Literal["auto", "reference", "fast", "cuda"]
ScanResult = tuple[Tensor, Tensor | None]

INSTALL_HINT = "pip install 'seqrec[mamba]'"

# Working-set budgets of the fast path, in float32 elements: a block of steps is processed
# by whole-block tensor operations (about 8 MB, so it stays in the L3 cache), and the state
# is kept for the backward pass once per chunk (the backward recomputes a chunk's states).
_BLOCK_ELEMENTS = 1 << 21
_CHUNK_ELEMENTS = 1 << 23


def selective_scan_reference(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    *,
    return_last_state: bool = False,
) -> ScanResult:
    """The recurrence one step at a time: the readable definition the other paths must match.

    Computed in float32, or float64 for float64 inputs; gradients come from autograd.
    """
    dtype = u.dtype
    work = torch.promote_types(dtype, torch.float32)
    u, delta, A, B, C = (t.to(work) for t in (u, delta, A, B, C))
    h = u.new_zeros(u.size(0), u.size(1), A.size(1))  # (B, D, N)
    ys = []
    for t in range(u.size(-1)):
        decay = torch.exp(delta[:, :, t, None] * A)  # exp(Delta_t A): (B, D, N)
        drive = (delta[:, :, t] * u[:, :, t]).unsqueeze(-1) * B[:, None, :, t]  # Delta_t B_t x_t
        h = decay * h + drive
        ys.append(torch.einsum("bdn,bn->bd", h, C[:, :, t]))  # C_t h_t: (B, D)
    y = torch.stack(ys, dim=-1)  # (B, D, L)
    if D is not None:
        y = y + D.to(work)[:, None] * u
    return y.to(dtype), (h if return_last_state else None)


def selective_scan_fast(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    *,
    return_last_state: bool = False,
    block_size: int | None = None,
    chunk_size: int | None = None,
) -> ScanResult:
    """Same values and gradients as ``selective_scan_reference``, many times faster on CPU.

    The sequence is cut into blocks of ``block_size`` steps. Everything that does not
    depend on the previous state (the decays exp(Delta A), the drives Delta B x, the
    outputs C h and all the gradient contractions) is one tensor operation per block; the
    recurrence itself is one fused multiply-add per step on a (B, D, N) slice. A custom
    backward pass runs the adjoint recurrence the same way, recomputing each chunk of
    ``chunk_size`` steps from the state saved at its start, so the (B, D, L, N) tensor of
    states is never kept.

    Why one multiply-add per step rather than a log-depth scan inside a block: on a CPU the
    B * D * N lanes of one step already fill the vector units, and memory traffic is what
    costs. A Hillis-Steele scan reads and writes a block log2(block) times; its forward pass
    alone measured 2-7x slower than this one (benchmarks/backbone_scaling.py prints both).
    A closed form from cumulative sums of Delta A needs exp(-cumsum), which overflows, or
    exp of pairwise differences, a tensor block times larger. The Python loop costs a few
    microseconds a step, against hundreds of microseconds of work per step at training
    sizes; at batch 1 it is most of the (small) cost.

    Every factor stays in range: decays are exp of non-positive numbers, never divided by.
    ``block_size`` and ``chunk_size`` (a multiple of it) default to fixed memory budgets;
    tests set them small to exercise the boundaries.
    """
    batch, channels, length = u.shape
    per_step = batch * channels * A.size(1)
    block = block_size or max(1, min(length, _BLOCK_ELEMENTS // per_step))
    chunk = chunk_size or max(block, _CHUNK_ELEMENTS // per_step // block * block)
    if block < 1 or chunk % block != 0:
        raise ValueError(f"chunk_size {chunk} must be a positive multiple of block_size {block}")
    skip = D.float() if D is not None else u.new_zeros(channels, dtype=torch.float32)
    y, last = _FastScan.apply(  # type: ignore[no-untyped-call]
        u.float(), delta.float(), A.float(), B.float(), C.float(), skip, block, chunk
    )
    return y.to(u.dtype), (last if return_last_state else None)


def _outer(x: Tensor, y: Tensor, out: Tensor) -> None:
    """out[t, b] = x[t, b] (outer) y[t, b]: (T, B, D) and (T, B, N) into (T, B, D, N)."""
    T, B, D = x.shape
    torch.bmm(x.reshape(T * B, D, 1), y.reshape(T * B, 1, -1), out=out.view(T * B, D, -1))


def _sum_over_state(v: Tensor, x: Tensor, out: Tensor) -> None:
    """out[t, b, d] = sum_n v[t, b, n] x[t, b, d, n]: (T, B, N), (T, B, D, N) -> (T, B, D).

    As a row vector times x transposed, which BLAS does about 2.5x faster than the
    matrix-vector product x v with its length-N inner products.
    """
    T, B, D, N = x.shape
    torch.bmm(
        v.reshape(T * B, 1, N), x.view(T * B, D, N).transpose(1, 2), out=out.view(T * B, 1, D)
    )


def _sum_over_channels(v: Tensor, x: Tensor, out: Tensor) -> None:
    """out[t, b, n] = sum_d v[t, b, d] x[t, b, d, n]: (T, B, D), (T, B, D, N) -> (T, B, N)."""
    T, B, D, N = x.shape
    torch.bmm(v.reshape(T * B, 1, D), x.view(T * B, D, N), out=out.view(T * B, 1, N))


def _scan_(decay: Tensor, h: Tensor, start: Tensor) -> None:
    """In place along dim 0: h_t <- decay_t * h_{t-1} + h_t, with h_{-1} = ``start``."""
    prev = start
    for a, h_t in zip(decay.unbind(0), h.unbind(0), strict=True):  # views: one call per step
        prev = h_t.addcmul_(a, prev)


def _reverse_scan_(decay: Tensor, lam: Tensor, carry: Tensor) -> None:
    """In place, the adjoint: lam_t <- lam_t + decay_{t+1} * lam_{t+1}; lam_{-1} += carry."""
    decays, lams = decay.unbind(0), lam.unbind(0)
    nxt = lams[-1].add_(carry)
    for t in range(len(lams) - 2, -1, -1):
        nxt = lams[t].addcmul_(decays[t + 1], nxt)


class _FastScan(torch.autograd.Function):
    """Time-major inside: u, delta (L, B, D); B, C (L, B, N); blocks (T, B, D, N)."""

    @staticmethod
    def forward(
        ctx: Any,
        u: Tensor,
        delta: Tensor,
        A: Tensor,
        B: Tensor,
        C: Tensor,
        D: Tensor,
        block: int,
        chunk: int,
    ) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        batch, channels, length = u.shape
        N = A.size(1)
        ut, dt = u.permute(2, 0, 1).contiguous(), delta.permute(2, 0, 1).contiguous()
        Bt, Ct = B.permute(2, 0, 1).contiguous(), C.permute(2, 0, 1).contiguous()
        drive_scale = dt * ut  # Delta x: (L, B, D)
        y = u.new_empty(length, batch, channels)
        decay = u.new_empty(block, batch, channels, N)
        h = u.new_empty(block, batch, channels, N)
        state = u.new_zeros(batch, channels, N)
        starts = []
        for s in range(0, length, block):
            e = min(s + block, length)
            if s % chunk == 0:
                starts.append(state.clone())
            a, hb = decay[: e - s], h[: e - s]
            torch.mul(dt[s:e, :, :, None], A, out=a).exp_()  # exp(Delta A): (T, B, D, N)
            _outer(drive_scale[s:e], Bt[s:e], out=hb)  # Delta_t x_t B_t: (T, B, D, N)
            _scan_(a, hb, state)
            _sum_over_state(Ct[s:e], hb, out=y[s:e])  # C_t h_t
            state.copy_(hb[-1])
        y.addcmul_(ut, D)
        ctx.save_for_backward(ut, dt, A, Bt, Ct, D, torch.stack(starts))
        ctx.sizes = (block, chunk)
        return y.permute(1, 2, 0), state

    @staticmethod
    def backward(ctx: Any, grad_y: Tensor | None, grad_last: Tensor | None) -> tuple[Any, ...]:
        ut, dt, A, Bt, Ct, D, starts = ctx.saved_tensors
        block, chunk = ctx.sizes
        length, batch, channels = ut.shape
        N = A.size(1)
        gy = (
            grad_y.permute(2, 0, 1).contiguous()
            if grad_y is not None
            else ut.new_zeros(length, batch, channels)
        )
        drive_scale = dt * ut
        g_drive_scale = ut.new_empty(length, batch, channels)  # dLoss / d(Delta x)
        g_dt = ut.new_empty(length, batch, channels)
        g_B, g_C = ut.new_empty(length, batch, N), ut.new_empty(length, batch, N)
        g_A = torch.zeros_like(A)
        span = min(chunk, length)
        decays = ut.new_empty(span, batch, channels, N)
        states = ut.new_empty(span + 1, batch, channels, N)  # row 0: the chunk's start state
        lam = ut.new_empty(block, batch, channels, N)
        # carry: decay_{t+1} * lam_{t+1} for the first step after the current block.
        carry = grad_last.clone() if grad_last is not None else ut.new_zeros(batch, channels, N)
        for index in range(starts.size(0) - 1, -1, -1):
            c0, c1 = index * chunk, min(index * chunk + chunk, length)
            blocks = range(c0, c1, block)
            states[0] = starts[index]
            for s in blocks:  # recompute the chunk's decays and states
                e = min(s + block, c1)
                a, hb = decays[s - c0 : e - c0], states[s - c0 + 1 : e - c0 + 1]
                torch.mul(dt[s:e, :, :, None], A, out=a).exp_()
                _outer(drive_scale[s:e], Bt[s:e], out=hb)
                _scan_(a, hb, states[s - c0])
            for s in reversed(blocks):  # the adjoint recurrence, last block first
                e = min(s + block, c1)
                K = (e - s) * batch
                a = decays[s - c0 : e - c0]
                h_prev, h = states[s - c0 : e - c0], states[s - c0 + 1 : e - c0 + 1]
                lb = lam[: e - s]
                _sum_over_channels(gy[s:e], h, out=g_C[s:e])  # dL/dC_t = sum_d gy_t h_t
                # lam_t = dL/dh_t = C_t gy_t + decay_{t+1} lam_{t+1}
                _outer(gy[s:e], Ct[s:e], out=lb)
                _reverse_scan_(a, lb, carry)
                torch.mul(a[0], lb[0], out=carry)
                # Drive Delta_t B_t x_t: dL/d(Delta x) = sum_n lam B, dL/dB = sum_d lam Delta x
                _sum_over_state(Bt[s:e], lb, out=g_drive_scale[s:e])
                _sum_over_channels(drive_scale[s:e], lb, out=g_B[s:e])
                # Decay exp(Delta_t A): w = lam_t * h_{t-1} * decay_t = dL/d(Delta_t A), then
                # dL/dDelta_t = sum_n w A and dL/dA = sum_{t,b} w Delta_t, as products batched
                # over channels (faster than multiply-and-sum on CPU).
                w = lb.mul_(a).mul_(h_prev).view(K, channels, N).transpose(0, 1)  # (D, K, N)
                g_dt[s:e].view(K, channels).copy_(torch.bmm(w, A.unsqueeze(-1)).squeeze(-1).T)
                dt_t = dt[s:e].view(K, channels).T.contiguous()  # (D, K): one BLAS call, no loop
                g_A.unsqueeze(1).baddbmm_(dt_t.unsqueeze(1), w)
        g_dt.addcmul_(g_drive_scale, ut)
        g_u = torch.addcmul(g_drive_scale * dt, gy, D)
        g_D = (gy * ut).sum(dim=(0, 1))
        g_u, g_dt, g_B, g_C = (g.permute(1, 2, 0) for g in (g_u, g_dt, g_B, g_C))  # (B, ., L)
        return g_u, g_dt, g_A, g_B, g_C, g_D, None, None


@functools.cache
def _mamba_kernel() -> Callable[..., Any] | None:
    """``mamba_ssm``'s fused selective scan, or None when it is not installed or does not load."""
    try:
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
    except (ImportError, OSError):
        return None
    kernel: Callable[..., Any] = selective_scan_fn
    return kernel


def cuda_scan_available() -> bool:
    """True when the CUDA kernel can run here: a GPU and a working ``mamba-ssm``."""
    return torch.cuda.is_available() and _mamba_kernel() is not None


def check_scan_impl(impl: ScanImpl) -> None:
    """Raise now, not mid-training, when ``impl`` cannot run on this machine."""
    if impl != "cuda":
        return
    if _mamba_kernel() is None:
        raise RuntimeError(f"scan 'cuda' needs the mamba-ssm kernel: {INSTALL_HINT}")
    if not torch.cuda.is_available():
        raise RuntimeError("scan 'cuda' needs a CUDA device; use scan 'auto' or 'fast' on CPU")


def selective_scan_cuda(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    *,
    return_last_state: bool = False,
) -> ScanResult:
    """``mamba_ssm.ops.selective_scan_interface.selective_scan_fn`` (CUDA tensors only)."""
    kernel = _mamba_kernel()
    if kernel is None:
        raise RuntimeError(f"scan 'cuda' needs the mamba-ssm kernel: {INSTALL_HINT}")
    if not u.is_cuda:
        raise RuntimeError("scan 'cuda' needs CUDA tensors; move the model to a GPU or use 'auto'")
    out = kernel(
        u.contiguous(),
        delta.contiguous(),
        A.float().contiguous(),
        B.contiguous(),
        C.contiguous(),
        None if D is None else D.float(),
        return_last_state=return_last_state,
    )
    if return_last_state:
        return out[0], out[1]
    return out, None


ScanFn = Callable[..., ScanResult]
SCANS: dict[Literal["reference", "fast", "cuda"], ScanFn] = {
    "reference": selective_scan_reference,
    "fast": selective_scan_fast,
    "cuda": selective_scan_cuda,
}


@functools.cache
def _log_auto_choice(choice: str, device: str) -> None:
    if device == "cuda" and choice != "cuda":
        logger.warning(
            "selective scan 'auto' uses the %r implementation on cuda: the mamba-ssm kernel "
            "is not installed (%s)",
            choice,
            INSTALL_HINT,
        )
    else:
        logger.info("selective scan 'auto' uses the %r implementation on %s", choice, device)


def selective_scan(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    *,
    impl: ScanImpl = "auto",
    return_last_state: bool = False,
) -> ScanResult:
    """Dispatch to ``impl``; "auto" is the CUDA kernel for CUDA tensors when installed, else
    "fast", and says which it took once per device type."""
    if impl == "auto":
        impl = "cuda" if u.is_cuda and _mamba_kernel() is not None else "fast"
        _log_auto_choice(impl, u.device.type)
    return SCANS[impl](u, delta, A, B, C, D, return_last_state=return_last_state)
