"""The selective scan of Mamba (S6), four ways: a readable reference, a chunked parallel
scan in plain PyTorch for any device, a compiled CPU kernel (numba, ``seqrec.nn.scan_kernel``)
and the ``mamba-ssm`` CUDA kernel, all with the same signature.

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

Choosing an implementation (``ScanImpl``): "reference" and "fast" run anywhere; "numba" needs
CPU tensors and ``pip install 'seqrec[numba]'``; "cuda" needs CUDA tensors and
``pip install 'seqrec[mamba]'``; "auto" takes the kernel of the tensors' device when it is
installed and applies, "fast" otherwise, and logs its choice once per device.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

logger = logging.getLogger(__name__)

ScanImpl = Literal["auto", "reference", "fast", "numba", "cuda"]
ScanResult = tuple[Tensor, Tensor | None]

INSTALL_HINT = "pip install 'seqrec[mamba]'"
NUMBA_HINT = "pip install 'seqrec[numba]'"

# Chunk plan of the fast path. A chunk's (steps, rows, D, N) tensors hold about
# _CHUNK_ELEMENTS elements (2 MB in float32 on CPU, so the dozen passes over a chunk mostly
# hit the cache; on a GPU, fewer and larger chunks mean fewer kernel launches). Steps per
# chunk are at least _MIN_STEPS: the parallel scan costs about 1.25 multiply-adds per step
# in chunks of 4 steps, 1.9 in chunks of 8 and 2.3 in chunks of 16, against 1 for a
# sequential loop, and on a CPU that work, not the Python loop over chunks, is what costs.
_CHUNK_ELEMENTS = {"cpu": 1 << 19}
_CHUNK_ELEMENTS_OTHER = 1 << 26
_MIN_STEPS = 4
_MAX_STEPS = 1024


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
    chunk_size: int | None = None,
    group_size: int | None = None,
) -> ScanResult:
    """Same values and gradients as ``selective_scan_reference``, with no Python loop over
    time steps.

    The batch is cut into groups of ``group_size`` rows and the sequence into chunks of
    ``chunk_size`` steps; a Python loop visits the chunks in order, carrying the state from
    one to the next (O(length / chunk_size) iterations per group). Inside a chunk every
    step is computed at once: the decays exp(Delta A) and drives Delta B x are one tensor
    operation each, and the linear recurrence h_t = a_t h_{t-1} + b_t is a work-efficient
    (Blelloch) parallel scan along time: three tensor operations on strided views per level,
    log2(chunk_size) levels, in place. A custom backward pass recomputes each chunk's states
    from the state saved at its start and runs the adjoint recurrence the same way, so the
    (B, D, L, N) tensor of states is never kept.

    Why chunks of only a few steps by default on a CPU: a parallel scan does more
    multiply-adds than the sequential recurrence (see ``_MIN_STEPS``), and at training
    sizes each step is already B * D * N lanes of vector work, so the extra work costs more
    than the Python loop it removes; at batch 1 a whole history is one chunk.

    Every factor stays in range: decays and products of decays are exp of non-positive
    numbers (they may underflow to 0, never overflow) and are never divided by, unlike a
    closed form through exp(-cumsum(Delta A)). ``chunk_size`` and ``group_size`` default to
    a fixed memory budget per chunk; tests set them small to exercise the boundaries.
    """
    for name, value in (("chunk_size", chunk_size), ("group_size", group_size)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1 (or None for the default), got {value}")
    steps, rows = _chunk_plan(u, A.size(1), chunk_size, group_size)
    work = torch.promote_types(u.dtype, torch.float32)  # float64 stays float64
    skip = D if D is not None else u.new_zeros(u.size(1))
    y, last = _ChunkedScan.apply(  # type: ignore[no-untyped-call]
        *(t.to(work) for t in (u, delta, A, B, C, skip)), steps, rows
    )
    return y.to(u.dtype), (last if return_last_state else None)


def _chunk_plan(
    u: Tensor, state: int, chunk_size: int | None, group_size: int | None
) -> tuple[int, int]:
    """Steps per chunk and rows per group: the given ones, else the budget's."""
    batch, channels, length = u.shape
    budget = _CHUNK_ELEMENTS.get(u.device.type, _CHUNK_ELEMENTS_OTHER)
    lanes = channels * state  # state elements per row and step
    steps = chunk_size or min(length, _MAX_STEPS, max(_MIN_STEPS, budget // (batch * lanes)))
    rows = group_size or min(batch, max(1, budget // (steps * lanes)))
    return steps, rows


def _scan_(links: Tensor, h: Tensor, scratch: Tensor) -> None:
    """In place along dim 0: h_t <- links_{t-1} * h_{t-1} + h_t for t >= 1.

    Blelloch's scan: pair each odd step with the step before it (one multiply-add on half
    the steps), scan the pairs recursively, then finish the even steps from their scanned
    predecessors. Each level is a few operations on strided views, so the recursion depth,
    not the length, is the number of Python calls. ``links`` is not modified; the decays
    between pairs go to ``scratch`` (at least len(h) // 2 rows shaped like ``h``).
    """
    length = h.size(0)
    if length < 2:
        return
    pairs = length // 2
    h[1 : 2 * pairs : 2].addcmul_(links[0 : 2 * pairs - 1 : 2], h[0 : 2 * pairs - 1 : 2])
    # From odd step 2k-1 to 2k+1 the decay is links_{2k} * links_{2k-1}.
    paired = torch.mul(
        links[2 : 2 * pairs - 1 : 2], links[1 : 2 * pairs - 2 : 2], out=scratch[: pairs - 1]
    )
    _scan_(paired, h[1 : 2 * pairs : 2], scratch[pairs - 1 :])
    h[2::2].addcmul_(links[1 : length - 1 : 2], h[1 : length - 1 : 2])


def _reverse_scan_(links: Tensor, g: Tensor, scratch: Tensor) -> None:
    """In place along dim 0, the adjoint of ``_scan_``: g_t <- g_t + links_t * g_{t+1} for
    t < L - 1, the same pairing mirrored (pairs counted from the end)."""
    length = g.size(0)
    if length < 2:
        return
    pairs = length // 2
    odd = length - 2 * pairs  # 1: step 0 is left out of the pairs
    g[odd : length - 1 : 2].addcmul_(links[odd : length - 1 : 2], g[odd + 1 : length : 2])
    paired = torch.mul(
        links[odd : length - 3 : 2], links[odd + 1 : length - 2 : 2], out=scratch[: pairs - 1]
    )
    _reverse_scan_(paired, g[odd : length - 1 : 2], scratch[pairs - 1 :])
    g[1 - odd : length - 2 : 2].addcmul_(
        links[1 - odd : length - 2 : 2], g[2 - odd : length - 1 : 2]
    )


def _chunk_states_(
    dt: Tensor, dx: Tensor, A: Tensor, Bc: Tensor, start: Tensor, out: Tensor
) -> None:
    """One chunk's decays exp(Delta_t A) and states h_t, into ``out`` (3, T, R, D, N): decays,
    states and scratch, from Delta and Delta x (T, R, D), B (T, R, N) and the state before
    the chunk (R, D, N)."""
    decay, h, scratch = out
    torch.mul(dt[..., None], A, out=decay).exp_()
    torch.mul(dx[..., None], Bc[:, :, None, :], out=h)  # the drives Delta_t B_t x_t
    h[0].addcmul_(decay[0], start)
    _scan_(decay[1:], h, scratch)


def _sum_over_state(v: Tensor, x: Tensor, out: Tensor) -> None:
    """out[t, r, d] = sum_n v[t, r, n] x[t, r, d, n]: (T, R, N), (T, R, D, N) -> (T, R, D).

    As a row vector times x transposed, which BLAS does about 2.5x faster than the
    matrix-vector product x v with its length-N inner products.
    """
    T, R, D, N = x.shape
    torch.bmm(v.view(T * R, 1, N), x.view(T * R, D, N).transpose(1, 2), out=out.view(T * R, 1, D))


def _sum_over_channels(v: Tensor, x: Tensor, out: Tensor) -> None:
    """out[t, r, n] = sum_d v[t, r, d] x[t, r, d, n]: (T, R, D), (T, R, D, N) -> (T, R, N)."""
    T, R, D, N = x.shape
    torch.bmm(v.view(T * R, 1, D), x.view(T * R, D, N), out=out.view(T * R, 1, N))


def _chunks(length: int, steps: int) -> list[tuple[int, int]]:
    """(first step, end step) of each chunk."""
    return [(s, min(s + steps, length)) for s in range(0, length, steps)]


class _ChunkedScan(torch.autograd.Function):
    """Per group of rows, time-major and contiguous inside: u, delta (L, R, D); B, C (L, R, N);
    a chunk's decays, states and adjoints (T, R, D, N)."""

    @staticmethod
    def forward(
        ctx: Any,
        u: Tensor,
        delta: Tensor,
        A: Tensor,
        B: Tensor,
        C: Tensor,
        D: Tensor,
        steps: int,
        rows: int,
    ) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        groups = [_time_major(t, rows) for t in (u, delta, B, C)]
        chunks = _chunks(u.size(-1), steps)
        ys, lasts, starts = [], [], []
        for ut, dt, Bt, Ct in zip(*groups, strict=True):
            dx = dt * ut  # Delta x: (L, R, D)
            state = u.new_zeros(ut.size(1), ut.size(2), A.size(1))
            y = torch.empty_like(ut)
            group_starts = []
            work = u.new_empty(3, steps, *state.shape)  # decays, states, scratch
            for s, e in chunks:
                group_starts.append(state)
                _chunk_states_(dt[s:e], dx[s:e], A, Bt[s:e], state, work[:, : e - s])
                h = work[1, : e - s]
                _sum_over_state(Ct[s:e], h, out=y[s:e])  # C_t h_t
                state = h[-1].clone()
            ys.append(y.addcmul_(ut, D).permute(1, 2, 0))
            lasts.append(state)
            starts.append(torch.stack(group_starts))  # the states the backward starts from
        ctx.save_for_backward(u, delta, A, B, C, D, *starts)
        ctx.sizes = (steps, rows)
        return torch.cat(ys), torch.cat(lasts)

    @staticmethod
    def backward(ctx: Any, grad_y: Tensor | None, grad_last: Tensor | None) -> tuple[Any, ...]:
        u, delta, A, B, C, D, *starts = ctx.saved_tensors
        steps, rows = ctx.sizes
        gy = grad_y if grad_y is not None else torch.zeros_like(u)
        groups = [_time_major(t, rows) for t in (u, delta, B, C, gy)]
        lasts = _split(grad_last, rows) if grad_last is not None else [None] * len(starts)
        chunks = _chunks(u.size(-1), steps)
        grads: list[list[Tensor]] = [[], [], [], []]
        g_A = torch.zeros_like(A)
        for ut, dt, Bt, Ct, gyt, group_starts, g_last in zip(*groups, starts, lasts, strict=True):
            dx = dt * ut
            g_dx, g_dt = torch.empty_like(ut), torch.empty_like(ut)  # dL/d(Delta x), dL/dDelta
            g_B, g_C = torch.empty_like(Bt), torch.empty_like(Ct)
            work = u.new_empty(4, steps, *group_starts.shape[1:])  # decays, states, scratch, lam
            # carry: decay_{t+1} * lam_{t+1} for the step after the current chunk.
            carry = torch.zeros_like(group_starts[0]) if g_last is None else g_last.clone()
            for (s, e), start in zip(reversed(chunks), group_starts.flip(0), strict=True):
                _chunk_states_(dt[s:e], dx[s:e], A, Bt[s:e], start, work[:3, : e - s])
                decay, h, scratch, lam = work[:, : e - s]
                _sum_over_channels(gyt[s:e], h, out=g_C[s:e])  # dL/dC_t = sum_d gy_t h_t
                # lam_t = dL/dh_t = C_t gy_t + decay_{t+1} lam_{t+1}
                torch.mul(gyt[s:e, :, :, None], Ct[s:e, :, None, :], out=lam)
                lam[-1] += carry
                _reverse_scan_(decay[1:], lam, scratch)
                torch.mul(decay[0], lam[0], out=carry)
                # Drive Delta_t B_t x_t: dL/d(Delta x) = sum_n lam B, dL/dB = sum_d lam Delta x
                _sum_over_state(Bt[s:e], lam, out=g_dx[s:e])
                _sum_over_channels(dx[s:e], lam, out=g_B[s:e])
                # Decay exp(Delta_t A): w = lam_t * decay_t * h_{t-1} = dL/d(Delta_t A)
                w = lam.mul_(decay)
                w[1:].mul_(h[:-1])
                w[0].mul_(start)
                g_dt[s:e] = _decay_grads_(w, dt[s:e], A, g_A)
            g_dt.addcmul_(g_dx, ut)
            g_u = torch.addcmul(g_dx * dt, gyt, D)
            for out, g in zip(grads, (g_u, g_dt, g_B, g_C), strict=True):
                out.append(g.permute(1, 2, 0))  # (R, ., L)
        g_D = (gy * u).sum(dim=(0, 2))
        g_u, g_dt, g_B, g_C = (torch.cat(g) for g in grads)
        return g_u, g_dt, g_A, g_B, g_C, g_D, None, None


def _time_major(x: Tensor, rows: int) -> list[Tensor]:
    """(B, ., L) -> groups of ``rows`` rows, each (L, R, .) contiguous."""
    return [g.permute(2, 0, 1).contiguous() for g in _split(x, rows)]


def _split(x: Tensor, rows: int) -> list[Tensor]:
    """Views of ``rows`` rows of x along dim 0 (the last group may be shorter)."""
    return [x[r : r + rows] for r in range(0, x.size(0), rows)]


def _decay_grads_(w: Tensor, dt: Tensor, A: Tensor, g_A: Tensor) -> Tensor:
    """From w = dL/d(Delta_t A) (T, R, D, N): returns dL/dDelta_t = sum_n w A (T, R, D) and
    adds dL/dA = sum_{t, r} w Delta_t to ``g_A``, as products batched over channels (faster
    than multiply-and-sum on CPU)."""
    T, R, channels, _ = w.shape
    wt = w.view(T * R, channels, -1).transpose(0, 1)  # (D, T R, N)
    g_A.unsqueeze(1).baddbmm_(dt.reshape(T * R, channels).T.unsqueeze(1), wt)
    return torch.bmm(wt, A.unsqueeze(-1)).view(channels, T, R).permute(1, 2, 0)


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
    if impl == "numba" and _numba_kernel() is None:
        raise RuntimeError(f"scan 'numba' needs numba: {NUMBA_HINT}")
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
    """``mamba_ssm.ops.selective_scan_interface.selective_scan_fn`` (CUDA tensors only).

    Its backward pass takes the gradient of y only, so the last state is returned detached:
    it says so, where an attached one would take a gradient the kernel then drops."""
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
        return out[0], out[1].detach()
    return out, None


@functools.cache
def _numba_kernel() -> ModuleType | None:
    """``seqrec.nn.scan_kernel``, or None when numba is not installed or does not load."""
    try:
        from seqrec.nn import scan_kernel
    except (ImportError, OSError):
        return None
    return scan_kernel


def numba_available() -> bool:
    """True when numba is installed and seqrec's CPU kernels load."""
    return _numba_kernel() is not None


def _loaded_numba_kernel() -> ModuleType:
    """The kernel module; an error that says how to install numba when it is missing."""
    kernel = _numba_kernel()
    if kernel is None:
        raise RuntimeError(f"scan 'numba' needs numba: {NUMBA_HINT}")
    return kernel


# numba's default thread pool must not be entered by two Python threads at once (a server
# scoring in several threads would abort the process), so kernel calls take turns.
_NUMBA_LOCK = threading.Lock()


def numba_scan_applies(u: Tensor, delta: Tensor, A: Tensor) -> bool:
    """Whether the numba kernel can compute this call: numba installed, CPU tensors of at
    most float32 precision, and Delta A <= 0 everywhere (its exp is for x <= 0 only)."""
    if _numba_kernel() is None or u.is_cuda or u.dtype == torch.float64:
        return False
    with torch.no_grad():
        return bool(A.max() <= 0) and bool(delta.min() >= 0)


def selective_scan_numba(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    *,
    return_last_state: bool = False,
) -> ScanResult:
    """The compiled CPU kernel (``seqrec.nn.scan_kernel``): the sequential recurrence, one
    thread per row, vectorised over the channels, its own backward pass.

    Computes in float32 (lower precisions are upcast and the results cast back); float64
    inputs and A or Delta of the wrong sign raise, as the kernel's exp assumes Delta A <= 0.
    Uses ``torch.get_num_threads()`` threads.
    """
    _loaded_numba_kernel()
    if u.is_cuda:
        raise RuntimeError("scan 'numba' needs CPU tensors; use 'cuda' or 'auto' on a GPU")
    if u.dtype == torch.float64:
        raise ValueError("scan 'numba' computes in float32; use 'fast' for float64 inputs")
    if not numba_scan_applies(u, delta, A):
        raise ValueError("scan 'numba' needs A <= 0 and delta >= 0, as Mamba parametrises them")
    skip = D if D is not None else u.new_zeros(u.size(1))
    y, last = _KernelScan.apply(  # type: ignore[no-untyped-call]
        *(t.float() for t in (u, delta, A, B, C, skip))
    )
    return y.to(u.dtype), (last if return_last_state else None)


def numpy_views(*tensors: Tensor) -> list[Any]:
    """Contiguous float32 numpy views (copies only where the layout needs them)."""
    return [t.detach().contiguous().numpy() for t in tensors]


def time_major_views(*tensors: Tensor) -> list[Any]:
    """Numpy views of (B, ., L) tensors as (B, L, .), strides as they are: no copies."""
    return [t.detach().transpose(1, 2).numpy() for t in tensors]


class _KernelScan(torch.autograd.Function):
    """``scan_kernel.scan_forward`` / ``scan_backward`` on transposed views of mamba's
    layout (the kernel takes any strides): u, delta (B, D, L), B and C (B, N, L) are read,
    and y and the gradients written, in place, so no tensor is copied to change its layout."""

    @staticmethod
    def forward(
        ctx: Any, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor
    ) -> tuple[Tensor, Tensor]:
        rows, channels, length = u.shape
        state = A.size(1)
        At = A.detach().T.contiguous()
        y = torch.empty_like(u)
        segments = -(-length // _loaded_numba_kernel().SEGMENT)
        starts = u.new_empty(rows, segments, state, channels)
        last = u.new_empty(rows, state, channels)
        with numba_turn() as kernel:
            kernel.scan_forward(
                *time_major_views(u, delta),
                At.numpy(),
                *time_major_views(B, C),
                *numpy_views(D),
                *time_major_views(y),
                starts.numpy(),
                last.numpy(),
                np.zeros(rows, dtype=np.int64),  # no padding assumed: every step computed
            )
        ctx.save_for_backward(u, delta, At, B, C, D, starts)
        ctx.set_materialize_grads(False)
        return y, last.transpose(1, 2)

    @staticmethod
    def backward(ctx: Any, grad_y: Tensor | None, grad_last: Tensor | None) -> tuple[Any, ...]:
        u, delta, At, B, C, D, starts = ctx.saved_tensors
        rows, channels, _ = u.shape
        state = At.size(0)
        gy = torch.zeros_like(u) if grad_y is None else grad_y.float()
        if grad_last is None:
            gl = u.new_zeros(rows, state, channels)
        else:
            gl = grad_last.float().transpose(1, 2).contiguous()
        g_u, g_delta = torch.empty_like(u), torch.empty_like(u)
        g_A_rows = u.new_empty(rows, state, channels)
        g_B, g_C = torch.empty_like(B), torch.empty_like(C)
        g_D_rows = u.new_empty(rows, channels)
        with numba_turn() as kernel:
            kernel.scan_backward(
                *time_major_views(u, delta),
                At.numpy(),
                *time_major_views(B, C),
                *numpy_views(D, starts),
                *time_major_views(gy),
                gl.numpy(),
                *time_major_views(g_u, g_delta),
                g_A_rows.numpy(),
                *time_major_views(g_B, g_C),
                g_D_rows.numpy(),
                np.zeros(rows, dtype=np.int64),
            )
        return g_u, g_delta, g_A_rows.sum(0).T, g_B, g_C, g_D_rows.sum(0)


@contextlib.contextmanager
def numba_turn() -> Iterator[ModuleType]:
    """``seqrec.nn.scan_kernel``, with this process's turn at numba's thread pool (the lock)
    and numba's thread count set to torch's for the calls made inside."""
    kernel = _loaded_numba_kernel()
    with _NUMBA_LOCK:
        _set_numba_threads()
        yield kernel


def _set_numba_threads() -> None:
    import numba

    config: Any = numba.config
    numba.set_num_threads(max(1, min(torch.get_num_threads(), config.NUMBA_NUM_THREADS)))


ScanFn = Callable[..., ScanResult]
SCANS: dict[Literal["reference", "fast", "numba", "cuda"], ScanFn] = {
    "reference": selective_scan_reference,
    "fast": selective_scan_fast,
    "numba": selective_scan_numba,
    "cuda": selective_scan_cuda,
}


@functools.cache
def log_auto_choice(choice: str, device: str) -> None:
    if device == "cuda" and choice != "cuda":
        logger.warning(
            "selective scan 'auto' uses the %r implementation on cuda: the mamba-ssm kernel "
            "is not installed (%s)",
            choice,
            INSTALL_HINT,
        )
    elif device == "cpu" and choice == "fast" and _numba_kernel() is None:
        logger.warning(
            "selective scan 'auto' uses the 'fast' implementation on cpu: numba is not "
            "installed; the compiled kernel is several times faster (%s)",
            NUMBA_HINT,
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
    """Dispatch to ``impl``; "auto" is the CUDA kernel for CUDA tensors and the numba kernel
    for CPU tensors when installed and applicable, else "fast", and says which it took once
    per device type."""
    if impl == "auto":
        if u.is_cuda:
            impl = "cuda" if _mamba_kernel() is not None else "fast"
        else:
            impl = "numba" if numba_scan_applies(u, delta, A) else "fast"
        log_auto_choice(impl, u.device.type)
    return SCANS[impl](u, delta, A, B, C, D, return_last_state=return_last_state)
