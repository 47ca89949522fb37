"""Mamba's selective scan as a compiled CPU kernel (numba), forward and backward.

One loop over time per (row, channel) with the N state values in registers: no (B, D, L, N)
tensor is ever made, and every multiply-add is the sequential recurrence's (no parallel-scan
overhead). Rows and channels run in parallel threads. The decays exp(Delta A) are most of
the work; ``_exp_nonpositive`` computes them with a polynomial the compiler vectorises over
the state index, about 4x faster than calling the C library's exp per element, within
5e-7 relative error. Padding stays exact: exp(0) = 1.

Float32 only, and Delta A <= 0 (Delta >= 0, A <= 0, which Mamba's Delta = softplus(.) and
A = -exp(A_log) guarantee); ``seqrec.nn.selective_scan`` checks both before calling. Shapes:
u, delta, y (B, D, L); A (D, N); Bt, Ct (B, L, N): B and C with time before state; skip (D,).
Importing this module compiles nothing; the first call compiles (a few seconds) and caches
the machine code on disk for later processes.
"""

from __future__ import annotations

import numba
import numpy as np
from numpy.typing import NDArray

F32 = NDArray[np.float32]

# numba's own thread pool. Its OpenMP layer would share libgomp with torch and reset torch's
# thread count (torch.get_num_threads() then changes under the user's feet). This takes
# effect only if nothing in the process has started numba's threads yet.
numba.config.THREADING_LAYER = "workqueue"  # type: ignore[attr-defined]

_LOG2E = np.float32(1.4426950408889634)
# ln 2 split in two so that k * _LN2_HI is exact for |k| < 2^11 (Cody and Waite).
_LN2_HI = np.float32(0.693359375)
_LN2_LO = np.float32(-2.12194440e-4)
_ONE = np.float32(1.0)
_ZERO = np.float32(0.0)
_EXP_FLOOR = np.float32(-87.0)  # exp(-87) ~ 1.6e-38, near float32's smallest normal


@numba.njit(fastmath=True, inline="always", cache=True)
def _exp_nonpositive(x: np.float32) -> np.float32:
    """exp(x) for x <= 0 in float32: x = k ln 2 + r with |r| <= ln 2 / 2, e^r by its Taylor
    polynomial of degree 7, 2^k by multiplying one power of two per bit of -k (no table
    lookup and no bit casts, so the loop around it vectorises)."""
    x = max(x, _EXP_FLOOR)
    k = np.int32(x * _LOG2E - np.float32(0.5))  # round to nearest, as x <= 0
    kf = np.float32(k)
    r = x - kf * _LN2_HI - kf * _LN2_LO
    p = np.float32(1.0 / 5040.0)
    p = p * r + np.float32(1.0 / 720.0)
    p = p * r + np.float32(1.0 / 120.0)
    p = p * r + np.float32(1.0 / 24.0)
    p = p * r + np.float32(1.0 / 6.0)
    p = p * r + np.float32(0.5)
    p = p * r + _ONE
    p = p * r + _ONE
    bits = -k  # 0..126
    scale = _ONE
    scale *= np.float32(2.0**-1) if bits & 1 else _ONE
    scale *= np.float32(2.0**-2) if bits & 2 else _ONE
    scale *= np.float32(2.0**-4) if bits & 4 else _ONE
    scale *= np.float32(2.0**-8) if bits & 8 else _ONE
    scale *= np.float32(2.0**-16) if bits & 16 else _ONE
    scale *= np.float32(2.0**-32) if bits & 32 else _ONE
    scale *= np.float32(2.0**-64) if bits & 64 else _ONE
    return p * scale


@numba.njit(parallel=True, fastmath=True, cache=True)
def scan_forward(
    u: F32, delta: F32, A: F32, Bt: F32, Ct: F32, skip: F32, y: F32, last: F32
) -> None:
    """y[b, d, t] = C_t . h_t + skip_d u_t and last[b, d] = h_{L-1}, for every row b and
    channel d, with h_t = exp(Delta_t A_d) * h_{t-1} + Delta_t u_t B_t."""
    rows, channels, length = u.shape
    state = A.shape[1]
    for job in numba.prange(rows * channels):
        b = job // channels
        d = job - b * channels
        h = np.zeros(state, dtype=np.float32)
        a = A[d]
        for t in range(length):
            dt = delta[b, d, t]
            x = u[b, d, t]
            drive = dt * x
            acc = _ZERO
            for n in range(state):
                hn = _exp_nonpositive(dt * a[n]) * h[n] + drive * Bt[b, t, n]
                h[n] = hn
                acc += Ct[b, t, n] * hn
            y[b, d, t] = acc + skip[d] * x
        for n in range(state):
            last[b, d, n] = h[n]


@numba.njit(parallel=True, fastmath=True, cache=True)
def scan_backward(
    u: F32,
    delta: F32,
    A: F32,
    Bt: F32,
    Ct: F32,
    skip: F32,
    grad_y: F32,
    grad_last: F32,
    grad_u: F32,
    grad_delta: F32,
    grad_A_rows: F32,
    grad_Bt: F32,
    grad_Ct: F32,
    grad_skip_rows: F32,
) -> None:
    """Gradients of the forward pass, one thread per row (grad_Bt and grad_Ct sum over the
    row's channels, so a row is never split). Per channel: the states are recomputed forward
    into a (L + 1, N) buffer with their decays, then the adjoint lam_t = dL/dh_t runs
    backward, lam_t = C_t gy_t + exp(Delta_{t+1} A) lam_{t+1}, starting from grad_last.
    grad_A_rows (B, D, N) and grad_skip_rows (B, D) are per-row partial sums, summed by the
    caller; grad_Bt and grad_Ct must come in zeroed (they accumulate over channels)."""
    rows, channels, length = u.shape
    state = A.shape[1]
    for b in numba.prange(rows):
        h = np.empty((length + 1, state), dtype=np.float32)
        decay = np.empty((length, state), dtype=np.float32)
        lam = np.empty(state, dtype=np.float32)
        g_a = np.empty(state, dtype=np.float32)  # dL/dA_d, this row's share
        for d in range(channels):
            a = A[d]
            for n in range(state):
                h[0, n] = _ZERO
            for t in range(length):
                dt = delta[b, d, t]
                drive = dt * u[b, d, t]
                for n in range(state):
                    e = _exp_nonpositive(dt * a[n])
                    decay[t, n] = e
                    h[t + 1, n] = e * h[t, n] + drive * Bt[b, t, n]
            for n in range(state):
                lam[n] = grad_last[b, d, n]
                g_a[n] = _ZERO
            g_skip = _ZERO
            for t in range(length - 1, -1, -1):
                dt = delta[b, d, t]
                x = u[b, d, t]
                gy = grad_y[b, d, t]
                g_skip += gy * x
                g_dt = _ZERO
                g_drive = _ZERO
                for n in range(state):
                    g = lam[n] + gy * Ct[b, t, n]  # dL/dh_t
                    grad_Ct[b, t, n] += gy * h[t + 1, n]
                    decayed = decay[t, n] * h[t, n]  # exp(Delta_t A) h_{t-1}
                    bn = Bt[b, t, n]
                    g_dt += g * (decayed * a[n] + bn * x)
                    g_a[n] += g * decayed * dt
                    g_drive += g * bn
                    grad_Bt[b, t, n] += g * dt * x
                    lam[n] = g * decay[t, n]
                grad_delta[b, d, t] = g_dt
                grad_u[b, d, t] = gy * skip[d] + g_drive * dt
            for n in range(state):
                grad_A_rows[b, d, n] = g_a[n]
            grad_skip_rows[b, d] = g_skip


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
