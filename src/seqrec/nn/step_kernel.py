"""One recurrent step of Mamba4Rec as compiled CPU kernels (numba), for serving.

Appending one item to a user's history is a few thousand multiply-adds per layer, which as
PyTorch operations cost far more in dispatch (some sixty small calls) than in arithmetic.
Here the step is three kinds of calls: ``embed_items`` (embedding and its LayerNorm),
``layer_step`` once per layer, and ``item_scores``. ``layer_step`` does, in float32, per user:

    x, z = W_in h;  window = (conv state, x);  u = SiLU(conv_K(window) + b)
    dt, B, C = W_x u;  Delta = softplus(W_dt dt + b_dt)
    s <- exp(Delta A) * s + Delta u B;  y = s C + D u;  m = W_out (y * SiLU(z))
    h' = LayerNorm(m (+ h when stacked))
    with the PFFN: h'' = LayerNorm(W_2 GELU(W_1 h' + b_1) + b_2 + h')

at inference (no dropout). ``Mamba4Rec.step``'s PyTorch path in ``seqrec.models.mamba4rec``
is the reference they must match; new states are written, the old ones left as they were.
Shapes: users B, model width D, inner width C, conv width K, state size N, dt rank R.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numpy.typing import NDArray

from seqrec.nn.scan_kernel import exp_nonpositive_f32, sigmoid_f32

F32 = NDArray[np.float32]

_SOFTPLUS_THRESHOLD = 20.0  # as torch's softplus: above it, softplus(x) = x
_INV_SQRT2 = 1.0 / math.sqrt(2.0)


@numba.njit(fastmath=True, cache=True, error_model="numpy")
def _layer_norm(x: F32, weight: F32, bias: F32, eps: float, out: F32) -> None:
    mean = x.mean()
    var = ((x - mean) ** 2).mean()
    scale = 1.0 / math.sqrt(var + eps)
    for i in range(x.shape[0]):
        out[i] = (x[i] - mean) * scale * weight[i] + bias[i]


@numba.njit(fastmath=True, cache=True, error_model="numpy")
def _matvec(matrix: F32, vector: F32, out: F32) -> None:
    """out = matrix @ vector, matrix (M, K) row-major: M dot products over contiguous rows."""
    for row in range(matrix.shape[0]):
        weights = matrix[row]
        total = np.float32(0.0)
        for k in range(vector.shape[0]):
            total += weights[k] * vector[k]
        out[row] = total


@numba.njit(fastmath=True, cache=True, error_model="numpy")
def _silu(x: np.float32) -> np.float32:
    return x * sigmoid_f32(x)


@numba.njit(fastmath=True, cache=True, error_model="numpy")
def _conv_step(window: F32, x: F32, weight: F32, bias: F32, u: F32, new_window: F32) -> None:
    """u = SiLU(the causal conv's output for the K-1 past inputs ``window`` (C, K-1) and x),
    and the window shifted by one: new_window (C, K-1)."""
    channels, taps = weight.shape
    for c in range(channels):
        total = bias[c] + weight[c, taps - 1] * x[c]
        for k in range(taps - 1):
            total += weight[c, k] * window[c, k]
        u[c] = _silu(total)
        for k in range(taps - 2):
            new_window[c, k] = window[c, k + 1]
        if taps > 1:
            new_window[c, taps - 2] = x[c]


@numba.njit(fastmath=True, cache=True, error_model="numpy")
def _ssm_step(
    ssm: F32,
    u: F32,
    delta: F32,
    A: F32,
    B: F32,
    C: F32,
    skip: F32,
    z: F32,
    gated: F32,
    new_ssm: F32,
) -> None:
    """new_ssm = exp(Delta A) ssm + Delta u B and gated = (new_ssm C + D u) * SiLU(z); the
    decays with the scan kernel's float32 exp (Delta A <= 0), as the training scan does."""
    channels, state = A.shape
    for c in range(channels):
        drive = delta[c] * u[c]
        y = skip[c] * u[c]
        for n in range(state):
            s = exp_nonpositive_f32(delta[c] * A[c, n]) * ssm[c, n] + drive * B[n]
            new_ssm[c, n] = s
            y += s * C[n]
        gated[c] = y * _silu(z[c])


@numba.njit(fastmath=True, cache=True, error_model="numpy")
def _feed_forward(h: F32, w_1: F32, b_1: F32, w_2: F32, b_2: F32, inner: F32, total: F32) -> None:
    """total = W_2 GELU(W_1 h + b_1) + b_2 + h (exact GELU); ``inner`` is scratch."""
    _matvec(w_1, h, inner)
    for j in range(inner.shape[0]):
        v = inner[j] + b_1[j]
        inner[j] = 0.5 * v * (1.0 + math.erf(v * _INV_SQRT2))
    _matvec(w_2, inner, total)
    for i in range(h.shape[0]):
        total[i] += b_2[i] + h[i]


@numba.njit(fastmath=True, cache=True, error_model="numpy")
def layer_step(
    hidden: F32,
    conv: F32,
    ssm: F32,
    A: F32,
    in_proj: F32,
    conv_weight: F32,
    conv_bias: F32,
    x_proj: F32,
    dt_weight: F32,
    dt_bias: F32,
    skip: F32,
    out_proj: F32,
    norm_weight: F32,
    norm_bias: F32,
    residual: bool,
    w_1: F32,
    b_1: F32,
    w_2: F32,
    b_2: F32,
    ffn_norm_weight: F32,
    ffn_norm_bias: F32,
    eps: float,
    out: F32,
    new_conv: F32,
    new_ssm: F32,
) -> None:
    """hidden (B, D), conv (B, C, K - 1), ssm (B, C, N) -> out (B, D), new_conv, new_ssm.

    A (C, N), in_proj (2C, D), conv_weight (C, K), x_proj (R + 2N, C), dt_weight (C, R),
    out_proj (D, C); w_1 has no rows when the layer has no PFFN (w_1 .. b_2 are then unused).
    """
    users, width = hidden.shape
    channels, state = A.shape
    rank = dt_weight.shape[1]
    xz = np.empty(2 * channels, dtype=np.float32)
    u = np.empty(channels, dtype=np.float32)
    proj = np.empty(rank + 2 * state, dtype=np.float32)
    delta = np.empty(channels, dtype=np.float32)
    gated = np.empty(channels, dtype=np.float32)
    mixed = np.empty(width, dtype=np.float32)
    normed = np.empty(width, dtype=np.float32)
    inner = np.empty(w_1.shape[0], dtype=np.float32)
    for b in range(users):
        _matvec(in_proj, hidden[b], xz)
        _conv_step(conv[b], xz[:channels], conv_weight, conv_bias, u, new_conv[b])
        _matvec(x_proj, u, proj)
        _matvec(dt_weight, proj[:rank], delta)
        for c in range(channels):
            pre = delta[c] + dt_bias[c]
            delta[c] = pre if pre > _SOFTPLUS_THRESHOLD else math.log1p(math.exp(pre))
        B, C = proj[rank : rank + state], proj[rank + state :]
        _ssm_step(ssm[b], u, delta, A, B, C, skip, xz[channels:], gated, new_ssm[b])
        _matvec(out_proj, gated, mixed)
        if residual:
            mixed += hidden[b]
        if w_1.shape[0] == 0:
            _layer_norm(mixed, norm_weight, norm_bias, eps, out[b])
            continue
        _layer_norm(mixed, norm_weight, norm_bias, eps, normed)
        _feed_forward(normed, w_1, b_1, w_2, b_2, inner, mixed)
        _layer_norm(mixed, ffn_norm_weight, ffn_norm_bias, eps, out[b])


@numba.njit(fastmath=True, cache=True, error_model="numpy")
def embed_items(
    ids: NDArray[np.int64],
    positions: NDArray[np.int64],
    table: F32,
    position_table: F32,
    norm_weight: F32,
    norm_bias: F32,
    eps: float,
    out: F32,
) -> None:
    """out (B, D) = LayerNorm(table[ids] (+ position_table[positions] when it has rows))."""
    vector = np.empty(table.shape[1], dtype=np.float32)
    for b in range(ids.shape[0]):
        vector[:] = table[ids[b]]
        if position_table.shape[0] > 0:
            vector += position_table[positions[b]]
        _layer_norm(vector, norm_weight, norm_bias, eps, out[b])


@numba.njit(fastmath=True, cache=True, error_model="numpy")
def item_scores(hidden: F32, table: F32, out: F32) -> None:
    """out (B, V) = hidden (B, D) @ table (V, D)^T."""
    for b in range(hidden.shape[0]):
        _matvec(table, hidden[b], out[b])
