"""Mamba's selective scan as a compiled CPU kernel (numba), forward and backward.

The sequential recurrence, h_t = exp(Delta_t A) * h_{t-1} + Delta_t u_t B_t, y_t = C_t h_t +
skip u_t, one thread per batch row. Arrays are channel-minor, so the innermost loops run
over the channels (Mamba's d_inner, 128 and up) with no reduction: long, vectorisable loops.
No (B, L, D, N) tensor is ever made. The decays exp(Delta A) are most of the forward work;
``exp_nonpositive_f32`` computes them with a polynomial and an exponent bit-cast, which the
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

The causal depthwise convolution and SiLU in front of the scan (``conv_silu_forward`` /
``conv_silu_backward``) are here too, for the fused Mamba block of ``seqrec.nn.mamba_inner``:
same layout, one thread per row, the backward recomputes the conv instead of keeping it.

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
def exp_nonpositive_f32(x: np.float32) -> np.float32:
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
                    v = exp_nonpositive_f32(dt[d] * a[d]) * hn[d] + drive[d] * bn
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
                e = exp_nonpositive_f32(dt[d] * a[d])
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
    grad_skip_rows (B, D) are per-row partial sums, summed by the caller. grad_u may be
    grad_y itself: step t reads its row of grad_y before it writes that row of grad_u, and
    no other step reads it."""
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
    """``exp_nonpositive_f32`` over an array (for tests)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(x)
    _exp_array(x.reshape(-1), out.reshape(-1))
    return out


@numba.njit(fastmath=True, cache=True)
def _exp_array(x: F32, out: F32) -> None:
    for i in range(x.size):
        out[i] = exp_nonpositive_f32(x[i])


@numba.njit(fastmath=True, inline="always", cache=True)
def sigmoid_f32(a: np.float32) -> np.float32:
    """1 / (1 + exp(-a)) through ``exp_nonpositive_f32`` of -|a|: no overflow, vectorisable."""
    e = exp_nonpositive_f32(-abs(a))
    return _ONE / (_ONE + e) if a >= _ZERO else e / (_ONE + e)


@numba.njit(fastmath=True, inline="always", cache=True)
def _conv_at(xz: F32, weight: F32, bias: F32, t: int, acc: F32) -> None:
    """acc (C,) <- bias + sum_k weight[k] * x_{t - K + 1 + k}, x = xz[:, :C] of one row; steps
    before the start count as zeros."""
    width, channels = weight.shape
    for d in range(channels):
        acc[d] = bias[d]
    for k in range(max(0, width - 1 - t), width):
        x = xz[t - width + 1 + k]
        w = weight[k]
        for d in range(channels):
            acc[d] += w[d] * x[d]


@numba.njit(parallel=True, fastmath=True, cache=True)
def conv_silu_forward(xz: F32, weight: F32, bias: F32, real: F32, u: F32) -> None:
    """u = real * SiLU(causal depthwise conv of x + bias), x the first C channels of xz.

    xz: (B, L, 2C) (x then Mamba's gate z), weight: (K, C), bias: (C,), real: (B, L) 1 or 0,
    u: (B, L, C), written.
    """
    rows, length, channels = u.shape
    for b in numba.prange(rows):
        acc = np.empty(channels, dtype=np.float32)
        for t in range(length):
            out = u[b, t]
            if real[b, t] == _ZERO:
                out[:] = _ZERO
                continue
            _conv_at(xz[b], weight, bias, t, acc)
            for d in range(channels):
                out[d] = acc[d] * sigmoid_f32(acc[d])


@numba.njit(parallel=True, fastmath=True, cache=True)
def conv_silu_backward(
    xz: F32,
    weight: F32,
    bias: F32,
    real: F32,
    grad_u: F32,
    grad_xz: F32,
    grad_weight_rows: F32,
    grad_bias_rows: F32,
) -> None:
    """Gradients of ``conv_silu_forward``: writes the x half of grad_xz (B, L, 2C), and the
    per-row partial sums grad_weight_rows (B, K, C) and grad_bias_rows (B, C)."""
    rows, length, channels = grad_u.shape
    width = weight.shape[0]
    for b in numba.prange(rows):
        g_acc = np.empty((length, channels), dtype=np.float32)  # dL/d(conv output)
        acc = np.empty(channels, dtype=np.float32)
        g_w = np.zeros((width, channels), dtype=np.float32)
        g_b = np.zeros(channels, dtype=np.float32)
        for t in range(length):
            ga = g_acc[t]
            if real[b, t] == _ZERO:
                ga[:] = _ZERO
                continue
            _conv_at(xz[b], weight, bias, t, acc)
            gu = grad_u[b, t]
            for d in range(channels):
                s = sigmoid_f32(acc[d])
                ga[d] = gu[d] * s * (_ONE + acc[d] * (_ONE - s))  # SiLU'(a) = s (1 + a (1 - s))
                g_b[d] += ga[d]
            for k in range(max(0, width - 1 - t), width):
                x = xz[b, t - width + 1 + k]
                gw = g_w[k]
                for d in range(channels):
                    gw[d] += ga[d] * x[d]
        for source in range(length):  # dL/dx_source, from the outputs that saw it
            gx = grad_xz[b, source]
            for d in range(channels):
                gx[d] = _ZERO
            for k in range(max(0, source + width - length), width):
                ga = g_acc[source + width - 1 - k]  # the output at t = source + K-1-k, tap k
                w = weight[k]
                for d in range(channels):
                    gx[d] += w[d] * ga[d]
        grad_weight_rows[b] = g_w
        grad_bias_rows[b] = g_b
