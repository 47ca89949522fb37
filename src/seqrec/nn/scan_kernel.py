"""Mamba's selective scan as a compiled CPU kernel (numba), forward and backward.

The sequential recurrence, h_t = exp(Delta_t A) * h_{t-1} + Delta_t u_t B_t, y_t = C_t h_t +
skip u_t, one thread per batch row. The innermost loops run over the channels (Mamba's
d_inner, 128 and up) with no reduction: long, vectorisable loops over contiguous buffers,
into which each step's channel vectors are copied first. So the arrays may have any strides:
a caller holding mamba's (B, D, L) layout passes transposed views, not transposed copies.
No (B, L, D, N) tensor is ever made. The decays exp(Delta A) are most of the forward work;
``exp_nonpositive_f32`` computes them with a polynomial and an exponent bit-cast, which the
compiler vectorises (about 4x faster than the C library's exp per element) within 5e-7
relative error, and exp(0) = 1 exactly, so left padding (Delta = 0) stays exact.

The forward pass also saves the state at the start of every ``SEGMENT`` steps; the backward
pass recomputes one segment's states and decays at a time from them (SEGMENT x N x D floats
each, never the whole sequence's) and runs the adjoint
lam_t = dL/dh_t = C_t gy_t + exp(Delta_{t+1} A) lam_{t+1} backward through it. Both passes
take two steps per sweep over the (N, D) state: the state (forward) or lam and dL/dA
(backward) are loaded and stored once per pair of steps instead of once per step.

Float32 only, and Delta A <= 0 (Delta >= 0, A <= 0, which Mamba's Delta = softplus(.) and
A = -exp(A_log) guarantee); ``seqrec.nn.selective_scan`` checks both and handles layouts.
Shapes (B rows, L steps, D channels, N states):

    u, delta, y: (B, L, D)   A: (N, D)   Bt, Ct: (B, L, N)   skip: (D,)
    starts: (B, ceil(L / SEGMENT), N, D)   last: (B, N, D)   padding: (B,) int64

``padding`` counts each row's leading padded steps (u = 0 and Delta = 0 there, as Mamba's
block makes them): whole segments of them are skipped, their outputs written as the
recurrence would. 0 everywhere computes every step.

The causal depthwise convolution and SiLU in front of the scan (``conv_silu_forward`` /
``conv_silu_backward``) are here too, for the fused Mamba block of ``seqrec.nn.mamba_inner``:
same layout, one thread per row, the backward recomputes the conv instead of keeping it.

Importing this module compiles nothing; the first call compiles (some seconds) and caches
the machine code on disk for later processes. ``scan_forward`` and ``scan_backward`` compile
their pass at most twice, for contiguous and for strided arrays, each when a call first needs
it, and never per mix of layouts.
"""

from __future__ import annotations

import functools
from typing import Literal

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core.dispatcher import Dispatcher
from numba.core.typing.templates import Signature
from numba.extending import intrinsic
from numpy.typing import NDArray

F32 = NDArray[np.float32]
I64 = NDArray[np.int64]

# numba's own thread pool. Its OpenMP layer would share libgomp with torch and reset torch's
# thread count (torch.get_num_threads() then changes under the user's feet). This takes
# effect only if nothing in the process has started numba's threads yet.
numba.config.THREADING_LAYER = "workqueue"  # type: ignore[attr-defined]


def _full_width_vectors_on_avx512() -> None:
    """Let LLVM use 512-bit vectors where the CPU has AVX-512.

    LLVM's tuning for Intel's AVX-512 CPUs (Skylake-X, Ice Lake, Rocket Lake, Sapphire Rapids)
    prefers 256-bit vectors even so, because short bursts of 512-bit code lower the clock for
    the code around them. These kernels are long, dense runs of multiply-adds and the
    polynomial exp, where full width pays: on a core of an Intel Xeon with AVX-512 and AMX
    (which LLVM took for a Rocket Lake) the scan's forward + backward took 0.057-0.059 s with
    512-bit vectors against 0.076 s without (batch 64 x 200, d_inner 128, N 32). A
    ``NUMBA_CPU_FEATURES`` set by the user wins; like the threading layer above, this only
    affects code numba compiles after it, in this process.
    """
    if numba.config.CPU_FEATURES is not None:  # type: ignore[attr-defined]
        return
    from numba.core.codegen import get_host_cpu_features

    features: str = get_host_cpu_features()  # type: ignore[no-untyped-call]
    if "+avx512f" in features.split(","):
        numba.config.CPU_FEATURES = features + ",-prefer-256-bit"  # type: ignore[attr-defined]


_full_width_vectors_on_avx512()

SEGMENT = 32  # steps per saved state: the backward buffers are (SEGMENT, N, D)
assert SEGMENT % 2 == 0, "the forward pass takes steps in pairs within a segment"

_LOG2E = np.float32(1.4426950408889634)
# ln 2 split in two so that k * _LN2_HI is exact for |k| < 2^11 (Cody and Waite).
_LN2_HI = np.float32(0.693359375)
_LN2_LO = np.float32(-2.12194440e-4)
_ONE = np.float32(1.0)
_ZERO = np.float32(0.0)
_EXP_FLOOR = np.float32(-87.0)  # exp(-87) ~ 1.6e-38: 2^k stays a normal float
# e^r on |r| <= ln 2 / 2 as 1 + r + c2 r^2 + ... + c5 r^5, c2..c5 fitted to minimise the
# largest relative error (1.1e-7, about the degree-6 Taylor polynomial's 1.2e-7, one
# multiply-add fewer); the first two fixed at 1 keep exp(0) = 1 exact.
_EXP_C2 = np.float32(0.499992311000824)
_EXP_C3 = np.float32(0.16667114198207855)
_EXP_C4 = np.float32(0.041890114545822144)
_EXP_C5 = np.float32(0.008312525227665901)


@intrinsic
def _float_from_bits(typingctx, bits):  # type: ignore[no-untyped-def]
    """The float32 whose IEEE-754 bit pattern is the int32 ``bits`` (an LLVM bitcast)."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@numba.njit(fastmath=True, inline="always", cache=True)
def exp_nonpositive_f32(x: np.float32) -> np.float32:
    """exp(x) for x <= 0 in float32: x = k ln 2 + r with |r| <= ln 2 / 2, e^r by a fitted
    polynomial of degree 5, 2^k by writing k + 127 into the exponent bits."""
    x = max(x, _EXP_FLOOR)
    k = np.int32(x * _LOG2E - np.float32(0.5))  # round to nearest, as x <= 0
    kf = np.float32(k)
    r = x - kf * _LN2_HI - kf * _LN2_LO
    p = _EXP_C5 * r + _EXP_C4
    p = p * r + _EXP_C3
    p = p * r + _EXP_C2
    p = p * r + _ONE
    p = p * r + _ONE
    return p * _float_from_bits((k + np.int32(127)) << np.int32(23))  # type: ignore[call-arg]


@numba.njit(parallel=True, fastmath=True, cache=True)
def scan_forward_kernel(
    u: F32,
    delta: F32,
    A: F32,
    Bt: F32,
    Ct: F32,
    skip: F32,
    y: F32,
    starts: F32,
    last: F32,
    padding: I64,
) -> None:
    """y, the state before every segment (``starts``) and after the last step (``last``).
    Two steps per pass over the state, which then stays in registers between them (SEGMENT
    is even, so a pair never straddles a segment start). Row b's first ``padding[b]`` steps
    must have u = 0 and Delta = 0 (left padding): the state stays zero through them, so the
    whole segments among them are not computed, only filled (y = 0, starts = 0)."""
    rows, length, channels = u.shape
    state = A.shape[0]
    for b in numba.prange(rows):
        h = np.zeros((state, channels), dtype=np.float32)
        begin = _first_computed_step(padding[b], length)
        y[b, :begin] = _ZERO
        starts[b, : begin // SEGMENT] = _ZERO
        dt1 = np.empty(channels, dtype=np.float32)
        dt2 = np.empty(channels, dtype=np.float32)
        drive1 = np.empty(channels, dtype=np.float32)
        drive2 = np.empty(channels, dtype=np.float32)
        out1 = np.empty(channels, dtype=np.float32)
        out2 = np.empty(channels, dtype=np.float32)
        for t in range(begin, length, 2):
            if t % SEGMENT == 0:
                starts[b, t // SEGMENT] = h
            if t + 1 == length:
                _stage_step(u[b, t], delta[b, t], skip, dt1, drive1, out1)
                _forward_step(dt1, drive1, A, Bt[b, t], Ct[b, t], h, out1)
                _copy(out1, y[b, t])
                break
            _stage_step(u[b, t], delta[b, t], skip, dt1, drive1, out1)
            _stage_step(u[b, t + 1], delta[b, t + 1], skip, dt2, drive2, out2)
            for n in range(state):
                a = A[n]
                hn = h[n]
                b1 = Bt[b, t, n]
                c1 = Ct[b, t, n]
                b2 = Bt[b, t + 1, n]
                c2 = Ct[b, t + 1, n]
                for d in range(channels):
                    v1 = exp_nonpositive_f32(dt1[d] * a[d]) * hn[d] + drive1[d] * b1
                    out1[d] += c1 * v1
                    v2 = exp_nonpositive_f32(dt2[d] * a[d]) * v1 + drive2[d] * b2
                    out2[d] += c2 * v2
                    hn[d] = v2
            _copy(out1, y[b, t])
            _copy(out2, y[b, t + 1])
        last[b] = h


@numba.njit(fastmath=True, inline="always", cache=True)
def _first_computed_step(padding: int, length: int) -> int:
    """The start of the segment that holds the first step after ``padding`` padded ones: the
    scan runs from there, whole segments before it are skipped."""
    return (min(max(padding, 0), length) // SEGMENT) * SEGMENT


@numba.njit(fastmath=True, inline="always", cache=True)
def _stage_step(x: F32, delta: F32, skip: F32, dt: F32, drive: F32, out: F32) -> None:
    """One step's inputs into contiguous buffers: dt = Delta_t, drive = Delta_t u_t, and
    out = skip u_t, to which the state's contributions are added."""
    for d in range(dt.shape[0]):
        dt[d] = delta[d]
        drive[d] = delta[d] * x[d]
        out[d] = skip[d] * x[d]


@numba.njit(fastmath=True, inline="always", cache=True)
def _copy(source: F32, target: F32) -> None:
    for d in range(source.shape[0]):
        target[d] = source[d]


@numba.njit(fastmath=True, inline="always", cache=True)
def _forward_step(dt: F32, drive: F32, A: F32, Bt: F32, Ct: F32, h: F32, out: F32) -> None:
    """One step of the recurrence from ``_stage_step``'s buffers: h (N, D) in place, the
    state's share of y added into out (D,)."""
    state, channels = A.shape
    for n in range(state):
        a = A[n]
        hn = h[n]
        bn = Bt[n]
        cn = Ct[n]
        for d in range(channels):
            v = exp_nonpositive_f32(dt[d] * a[d]) * hn[d] + drive[d] * bn
            hn[d] = v
            out[d] += cn * v


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
def scan_backward_kernel(
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
    padding: I64,
) -> None:
    """Gradients of ``scan_forward_kernel``, one thread per row. grad_A_rows (B, N, D) and
    grad_skip_rows (B, D) are per-row partial sums, summed by the caller. grad_u may be
    grad_y itself: step t reads its row of grad_y before it writes that row of grad_u, and
    no other step reads it. In the skipped segments of left padding (``padding`` as in the
    forward pass: u = 0, Delta = 0, h = 0 there) dL/du = skip * dL/dy and the rest is zero."""
    rows, length, channels = u.shape
    state = A.shape[0]
    for b in numba.prange(rows):
        begin = _first_computed_step(padding[b], length)
        for t in range(begin):
            _write_padded_step_grads(
                grad_y[b, t], skip, grad_u[b, t], grad_delta[b, t], grad_Bt[b, t], grad_Ct[b, t]
            )
        h = np.empty((SEGMENT + 1, state, channels), dtype=np.float32)
        decay = np.empty((SEGMENT, state, channels), dtype=np.float32)
        dt_seg = np.empty((SEGMENT, channels), dtype=np.float32)  # the segment's Delta, u
        x_seg = np.empty((SEGMENT, channels), dtype=np.float32)
        gy1 = np.empty(channels, dtype=np.float32)  # dL/dy_t, staged
        gy0 = np.empty(channels, dtype=np.float32)  # dL/dy_{t-1}
        lam = grad_last[b].copy()  # dL/dh after the last step
        g_a = np.zeros((state, channels), dtype=np.float32)
        g_skip = np.zeros(channels, dtype=np.float32)
        drive1 = np.empty(channels, dtype=np.float32)  # scratch: Delta_t u_t of step t
        g_dt1 = np.empty(channels, dtype=np.float32)
        g_drive1 = np.empty(channels, dtype=np.float32)
        g_dt0 = np.empty(channels, dtype=np.float32)  # the same three for step t - 1
        g_drive0 = np.empty(channels, dtype=np.float32)
        drive0 = np.empty(channels, dtype=np.float32)
        for k in range((length - 1) // SEGMENT, begin // SEGMENT - 1, -1):
            s = k * SEGMENT
            e = min(s + SEGMENT, length)
            for j in range(e - s):
                _copy(delta[b, s + j], dt_seg[j])
                _copy(u[b, s + j], x_seg[j])
            dts = dt_seg[: e - s]
            xs = x_seg[: e - s]
            _segment_states(dts, xs, A, Bt[b, s:e], starts[b, k], h, decay, drive1)
            j = e - s - 1
            while j >= 1:  # steps t = s + j and t - 1 in one pass over lam and g_a
                t = s + j
                _copy(grad_y[b, t], gy1)
                _copy(grad_y[b, t - 1], gy0)
                x1 = xs[j]
                x0 = xs[j - 1]
                for d in range(channels):
                    g_dt1[d] = _ZERO
                    g_drive1[d] = _ZERO
                    g_dt0[d] = _ZERO
                    g_drive0[d] = _ZERO
                    g_skip[d] += gy1[d] * x1[d] + gy0[d] * x0[d]
                _adjoint_two_steps(
                    A, dts[j], x1, gy1, Bt[b, t], Ct[b, t],
                    dts[j - 1], x0, gy0, Bt[b, t - 1], Ct[b, t - 1],
                    h[j - 1], h[j], h[j + 1], decay[j], decay[j - 1], lam, g_a,
                    g_dt1, g_drive1, g_dt0, g_drive0, grad_Bt[b, t], grad_Ct[b, t],
                    grad_Bt[b, t - 1], grad_Ct[b, t - 1], drive1, drive0,
                )  # fmt: skip
                _write_step_grads(
                    dts[j], gy1, skip, g_dt1, g_drive1, grad_delta[b, t], grad_u[b, t]
                )
                _write_step_grads(
                    dts[j - 1], gy0, skip, g_dt0, g_drive0, grad_delta[b, t - 1], grad_u[b, t - 1]
                )
                j -= 2
            if j == 0:  # a segment of odd length: its first step alone
                t = s
                _copy(grad_y[b, t], gy1)
                x = xs[0]
                for d in range(channels):
                    g_dt1[d] = _ZERO
                    g_drive1[d] = _ZERO
                    g_skip[d] += gy1[d] * x[d]
                _adjoint_step(
                    A, dts[0], x, gy1, Bt[b, t], Ct[b, t], h[0], h[1], decay[0], lam, g_a,
                    g_dt1, g_drive1, grad_Bt[b, t], grad_Ct[b, t], drive1,
                )  # fmt: skip
                _write_step_grads(
                    dts[0], gy1, skip, g_dt1, g_drive1, grad_delta[b, t], grad_u[b, t]
                )
        grad_A_rows[b] = g_a
        grad_skip_rows[b] = g_skip


@numba.njit(fastmath=True, inline="always", cache=True)
def _write_padded_step_grads(
    gy: F32, skip: F32, out_u: F32, out_delta: F32, out_Bt: F32, out_Ct: F32
) -> None:
    """The gradients of a padded step (u = 0, Delta = 0, h = 0): only y = skip * u's."""
    for d in range(gy.shape[0]):
        out_u[d] = gy[d] * skip[d]
        out_delta[d] = _ZERO
    for n in range(out_Bt.shape[0]):
        out_Bt[n] = _ZERO
        out_Ct[n] = _ZERO


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


@numba.njit(fastmath=True, inline="always", cache=True)
def _write_step_grads(
    dt: F32, gy: F32, skip: F32, g_dt: F32, g_drive: F32, out_delta: F32, out_u: F32
) -> None:
    """dL/dDelta_t and dL/du_t of one step from staged buffers."""
    for d in range(dt.shape[0]):
        out_delta[d] = g_dt[d]
        out_u[d] = gy[d] * skip[d] + g_drive[d] * dt[d]


@numba.njit(fastmath=True, inline="always", cache=True)
def _adjoint_two_steps(
    A: F32,
    dt1: F32,
    x1: F32,
    gy1: F32,
    B1: F32,
    C1: F32,
    dt0: F32,
    x0: F32,
    gy0: F32,
    B0: F32,
    C0: F32,
    h_before: F32,
    h_mid: F32,
    h_after: F32,
    decay1: F32,
    decay0: F32,
    lam: F32,
    g_a: F32,
    g_dt1: F32,
    g_drive1: F32,
    g_dt0: F32,
    g_drive0: F32,
    grad_B1: F32,
    grad_C1: F32,
    grad_B0: F32,
    grad_C0: F32,
    drive1: F32,
    drive0: F32,
) -> None:
    """``_adjoint_step`` for step t (suffix 1) and then t - 1 (suffix 0) in one loop over
    the channels: lam and g_a are loaded and stored once for both steps, and h_{t-1} serves
    as step t's previous state and step t-1's new one. h_before, h_mid, h_after are
    h_{t-2}, h_{t-1}, h_t."""
    state, channels = A.shape
    for d in range(channels):
        drive1[d] = dt1[d] * x1[d]
        drive0[d] = dt0[d] * x0[d]
    for n in range(state):
        a = A[n]
        lam_n = lam[n]
        g_a_n = g_a[n]
        e1 = decay1[n]
        e0 = decay0[n]
        before = h_before[n]
        mid = h_mid[n]
        after = h_after[n]
        b1 = B1[n]
        c1 = C1[n]
        b0 = B0[n]
        c0 = C0[n]
        grad_c1 = _ZERO
        grad_b1 = _ZERO
        grad_c0 = _ZERO
        grad_b0 = _ZERO
        for d in range(channels):
            g1 = lam_n[d] + gy1[d] * c1
            w1 = g1 * e1[d] * mid[d]
            grad_c1 += gy1[d] * after[d]
            grad_b1 += g1 * drive1[d]
            g0 = g1 * e1[d] + gy0[d] * c0
            w0 = g0 * e0[d] * before[d]
            grad_c0 += gy0[d] * mid[d]
            grad_b0 += g0 * drive0[d]
            g_dt1[d] += w1 * a[d]
            g_dt0[d] += w0 * a[d]
            g_a_n[d] += w1 * dt1[d] + w0 * dt0[d]
            g_drive1[d] += g1 * b1
            g_drive0[d] += g0 * b0
            lam_n[d] = g0 * e0[d]
        grad_C1[n] = grad_c1
        grad_B1[n] = grad_b1
        grad_C0[n] = grad_c0
        grad_B0[n] = grad_b0
    for d in range(channels):
        g_dt1[d] += x1[d] * g_drive1[d]
        g_dt0[d] += x0[d] * g_drive0[d]


@functools.cache
def scan_signatures(strided: Literal["C", "A"]) -> tuple[Signature, Signature]:
    """The passes' signatures: u, delta, B, C, y and their gradients in layout ``strided``,
    the rest (A, skip, starts, last, the per-row sums, the int64 padding) C-contiguous."""

    def arr(ndim: int, layout: Literal["C", "A"] = "C") -> types.Array:
        return types.Array(types.float32, ndim, layout)

    seq = arr(3, strided)
    padding = types.Array(types.int64, 1, "C")
    forward = types.void(seq, seq, arr(2), seq, seq, arr(1), seq, arr(4), arr(3), padding)
    backward = types.void(
        seq, seq, arr(2), seq, seq, arr(1), arr(4), seq, arr(3),
        seq, seq, arr(3), seq, seq, arr(2), padding,
    )  # fmt: skip
    return forward, backward


def scan_forward(*arrays: F32) -> None:
    """``scan_forward_kernel(*arrays)``, compiled on first use for the layout of its (B, L, .)
    arrays (u, delta, Bt, Ct, y)."""
    _run(scan_forward_kernel, 0, arrays)


def scan_backward(*arrays: F32) -> None:
    """``scan_backward_kernel(*arrays)``, compiled on first use for the layout of its
    (B, L, .) arrays (u, delta, Bt, Ct, grad_y and the gradients of the four)."""
    _run(scan_backward_kernel, 1, arrays)


def _run(kernel: Dispatcher, which: Literal[0, 1], arrays: tuple[F32, ...]) -> None:
    """Call pass ``which`` of ``scan_signatures`` in its version for the layout of the
    sequence arrays."""
    arity, sequence_positions = _sequence_positions(which)
    if len(arrays) != arity:
        raise TypeError(f"{kernel.py_func.__name__} takes {arity} arrays, got {len(arrays)}")
    contiguous = all(arrays[position].flags.c_contiguous for position in sequence_positions)
    _compiled(kernel, scan_signatures("C" if contiguous else "A")[which])(*arrays)


@functools.cache
def _sequence_positions(which: Literal[0, 1]) -> tuple[int, tuple[int, ...]]:
    """How many arrays pass ``which`` takes, and the positions of its sequence arrays: those
    whose type differs between the "C" and "A" signatures."""
    contiguous, strided = scan_signatures("C")[which].args, scan_signatures("A")[which].args
    positions = tuple(i for i, (c, a) in enumerate(zip(contiguous, strided, strict=True)) if c != a)
    return len(contiguous), positions


def _compiled(kernel: Dispatcher, signature: Signature) -> Dispatcher:
    """``kernel`` (a scan pass) with its version for ``signature`` loaded from numba's disk
    cache or, the first time on a machine, compiled (half a minute). Each pass has at most
    two versions, for C-contiguous and for any-strided sequence arrays, compiled only when a
    call needs them: left to itself numba would compile one for every mix of C-contiguous,
    Fortran-contiguous and strided arrays it is called with. The contiguous version is worth
    its compilation because the fused Mamba block's contiguous buffers run about a quarter
    faster through it (the compiler knows the step rows it stages are unit-stride)."""
    if signature.args not in kernel.overloads:
        kernel.disable_compile(False)
        try:
            kernel.compile(signature)
        finally:
            if kernel.signatures:
                kernel.disable_compile(True)
    return kernel


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
