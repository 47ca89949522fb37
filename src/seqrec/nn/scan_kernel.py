"""Mamba's selective scan as a compiled CPU kernel (numba), forward and backward.

The sequential recurrence, h_t = exp(Delta_t A) * h_{t-1} + Delta_t u_t B_t, y_t = C_t h_t +
skip u_t, one thread per batch row. Arrays are channel-minor, so the innermost loops run
over the channels (Mamba's d_inner, 128 and up) with no reduction: long, vectorisable loops.
No (B, L, D, N) tensor is ever made. The decays exp(Delta A) are most of the forward work;
``_exp_nonpositive`` computes them with a polynomial and an exponent bit-cast, which the
compiler vectorises (about 4x faster than the C library's exp per element) within 5e-7
relative error, and exp(0) = 1 exactly, so left padding (Delta = 0) stays exact.

The forward pass also saves the state at the start of every ``SEGMENT`` steps; the backward
pass recomputes one segment's states and decays at a time from them (SEGMENT x N x D floats
each, never the whole sequence's) and runs the adjoint
lam_t = dL/dh_t = C_t gy_t + exp(Delta_{t+1} A) lam_{t+1} backward through it.

Float32 only, and Delta A <= 0 (Delta >= 0, A <= 0, which Mamba's Delta = softplus(.) and
A = -exp(A_log) guarantee); ``seqrec.nn.selective_scan`` checks both and handles layouts.
Shapes (B rows, L steps, D channels, N states):

    u, delta, y: (B, L, D)   A: (N, D)   Bt, Ct: (B, L, N)   skip: (D,)
    starts: (B, ceil(L / SEGMENT), N, D)   last: (B, N, D)

Importing this module compiles nothing; the first call compiles (some seconds) and caches
the machine code on disk for later processes.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic
from numpy.typing import NDArray

F32 = NDArray[np.float32]

# numba's own thread pool. Its OpenMP layer would share libgomp with torch and reset torch's
# thread count (torch.get_num_threads() then changes under the user's feet). This takes
# effect only if nothing in the process has started numba's threads yet.
numba.config.THREADING_LAYER = "workqueue"  # type: ignore[attr-defined]

SEGMENT = 32  # steps per saved state: the backward buffers are (SEGMENT, N, D)

_LOG2E = np.float32(1.4426950408889634)
# ln 2 split in two so that k * _LN2_HI is exact for |k| < 2^11 (Cody and Waite).
_LN2_HI = np.float32(0.693359375)
_LN2_LO = np.float32(-2.12194440e-4)
_ONE = np.float32(1.0)
_ZERO = np.float32(0.0)
_EXP_FLOOR = np.float32(-87.0)  # exp(-87) ~ 1.6e-38: 2^k stays a normal float


@intrinsic
def _float_from_bits(typingctx, bits):  # type: ignore[no-untyped-def]
    """The float32 whose IEEE-754 bit pattern is the int32 ``bits`` (an LLVM bitcast)."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@numba.njit(fastmath=True, inline="always", cache=True)
def _exp_nonpositive(x: np.float32) -> np.float32:
    """exp(x) for x <= 0 in float32: x = k ln 2 + r with |r| <= ln 2 / 2, e^r by its Taylor
    polynomial of degree 6, 2^k by writing k + 127 into the exponent bits."""
    x = max(x, _EXP_FLOOR)
    k = np.int32(x * _LOG2E - np.float32(0.5))  # round to nearest, as x <= 0
    kf = np.float32(k)
    r = x - kf * _LN2_HI - kf * _LN2_LO
    p = np.float32(1.0 / 720.0)
    p = p * r + np.float32(1.0 / 120.0)
    p = p * r + np.float32(1.0 / 24.0)
    p = p * r + np.float32(1.0 / 6.0)
    p = p * r + np.float32(0.5)
    p = p * r + _ONE
    p = p * r + _ONE
    return p * _float_from_bits((k + np.int32(127)) << np.int32(23))  # type: ignore[call-arg]


@numba.njit(parallel=True, fastmath=True, cache=True)
def scan_forward(
    u: F32, delta: F32, A: F32, Bt: F32, Ct: F32, skip: F32, y: F32, starts: F32, last: F32
) -> None:
    """y, the state before every segment (``starts``) and after the last step (``last``)."""
    rows, length, channels = u.shape
    state = A.shape[0]
    for b in numba.prange(rows):
        h = np.zeros((state, channels), dtype=np.float32)
        drive = np.empty(channels, dtype=np.float32)
        for t in range(length):
            if t % SEGMENT == 0:
                starts[b, t // SEGMENT] = h
            dt = delta[b, t]
            x = u[b, t]
            out = y[b, t]
            for d in range(channels):
                drive[d] = dt[d] * x[d]
                out[d] = skip[d] * x[d]
            for n in range(state):
                a = A[n]
                hn = h[n]
                bn = Bt[b, t, n]
                cn = Ct[b, t, n]
                for d in range(channels):
                    v = _exp_nonpositive(dt[d] * a[d]) * hn[d] + drive[d] * bn
                    hn[d] = v
                    out[d] += cn * v
        last[b] = h


@numba.njit(fastmath=True, cache=True)
def _segment_states(
    delta: F32, u: F32, A: F32, Bt: F32, start: F32, h: F32, decay: F32, drive: F32
) -> None:
    """States h[0..S] (h[0] = start) and decays[0..S-1] of one segment's S steps:
    delta, u (S, D), Bt (S, N); ``drive`` (D,) is scratch."""
    state, channels = A.shape
    h[0] = start
    for j in range(delta.shape[0]):
        dt = delta[j]
        x = u[j]
        for d in range(channels):
            drive[d] = dt[d] * x[d]
        for n in range(state):
            a = A[n]
            bn = Bt[j, n]
            prev = h[j, n]
            cur = h[j + 1, n]
            dec = decay[j, n]
            for d in range(channels):
                e = _exp_nonpositive(dt[d] * a[d])
                dec[d] = e
                cur[d] = e * prev[d] + drive[d] * bn


@numba.njit(parallel=True, fastmath=True, cache=True)
def scan_backward(
    u: F32,
    delta: F32,
    A: F32,
    Bt: F32,
    Ct: F32,
    skip: F32,
    starts: F32,
    grad_y: F32,
    grad_last: F32,
    grad_u: F32,
    grad_delta: F32,
    grad_A_rows: F32,
    grad_Bt: F32,
    grad_Ct: F32,
    grad_skip_rows: F32,
) -> None:
    """Gradients of ``scan_forward``, one thread per row. grad_A_rows (B, N, D) and
    grad_skip_rows (B, D) are per-row partial sums, summed by the caller."""
    rows, length, channels = u.shape
    state = A.shape[0]
    for b in numba.prange(rows):
        h = np.empty((SEGMENT + 1, state, channels), dtype=np.float32)
        decay = np.empty((SEGMENT, state, channels), dtype=np.float32)
        lam = grad_last[b].copy()  # dL/dh after the last step
        g_a = np.zeros((state, channels), dtype=np.float32)
        g_skip = np.zeros(channels, dtype=np.float32)
        drive = np.empty(channels, dtype=np.float32)  # scratch: Delta_t u_t
        g_dt = np.empty(channels, dtype=np.float32)
        g_drive = np.empty(channels, dtype=np.float32)
        for k in range((length - 1) // SEGMENT, -1, -1):
            s = k * SEGMENT
            e = min(s + SEGMENT, length)
            _segment_states(delta[b, s:e], u[b, s:e], A, Bt[b, s:e], starts[b, k], h, decay, drive)
            for j in range(e - s - 1, -1, -1):
                t = s + j
                dt = delta[b, t]
                x = u[b, t]
                gy = grad_y[b, t]
                for d in range(channels):
                    g_dt[d] = _ZERO
                    g_drive[d] = _ZERO
                    g_skip[d] += gy[d] * x[d]
                _adjoint_step(
                    A, dt, x, gy, Bt[b, t], Ct[b, t], h[j], h[j + 1], decay[j], lam, g_a,
                    g_dt, g_drive, grad_Bt[b, t], grad_Ct[b, t], drive,
                )  # fmt: skip
                out_delta = grad_delta[b, t]
                out_u = grad_u[b, t]
                for d in range(channels):
                    out_delta[d] = g_dt[d]
                    out_u[d] = gy[d] * skip[d] + g_drive[d] * dt[d]
        grad_A_rows[b] = g_a
        grad_skip_rows[b] = g_skip


@numba.njit(fastmath=True, inline="always", cache=True)
def _adjoint_step(
    A: F32,
    dt: F32,
    x: F32,
    gy: F32,
    Bt: F32,
    Ct: F32,
    h_prev: F32,
    h_cur: F32,
    decay: F32,
    lam: F32,
    g_a: F32,
    g_dt: F32,
    g_drive: F32,
    grad_Bt: F32,
    grad_Ct: F32,
    drive: F32,
) -> None:
    """One step t backward, every state index: lam (N, D) goes from dL/dh_t's decayed share
    to dL/dh_{t-1}'s; adds into g_a (N, D), g_dt and g_drive (D,); writes grad_Bt and
    grad_Ct (N,). One fused loop over the channels per state index: the step is bound by
    arithmetic, and every extra pass reloads the same rows. The input's share of dL/dDelta,
    x * sum_n g B_n, is added once at the end instead of per state index."""
    state, channels = A.shape
    for d in range(channels):
        drive[d] = dt[d] * x[d]
    for n in range(state):
        a = A[n]
        lam_n = lam[n]
        g_a_n = g_a[n]
        dec = decay[n]
        prev = h_prev[n]
        cur = h_cur[n]
        bn = Bt[n]
        cn = Ct[n]
        grad_c = _ZERO
        grad_b = _ZERO
        for d in range(channels):
            g = lam_n[d] + gy[d] * cn  # dL/dh_t
            w = g * dec[d] * prev[d]  # times exp(Delta_t A) h_{t-1}, d/dDelta and d/dA
            grad_c += gy[d] * cur[d]
            grad_b += g * drive[d]
            g_dt[d] += w * a[d]
            g_a_n[d] += w * dt[d]
            g_drive[d] += g * bn
            lam_n[d] = g * dec[d]
        grad_Ct[n] = grad_c
        grad_Bt[n] = grad_b
    for d in range(channels):
        g_dt[d] += x[d] * g_drive[d]


def exp_nonpositive(x: F32) -> F32:
    """``_exp_nonpositive`` over an array (for tests)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(x)
    _exp_array(x.reshape(-1), out.reshape(-1))
    return out


@numba.njit(fastmath=True, cache=True)
def _exp_array(x: F32, out: F32) -> None:
    for i in range(x.size):
        out[i] = _exp_nonpositive(x[i])
