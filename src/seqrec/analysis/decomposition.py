"""Norm-based decomposition of an attention block (Kobayashi et al. 2020/2021, as used by
Kozaki et al., RecSys 2026, Sec. 4 and supplement Eq. 22).

What our SASRec block computes at position i (pre-LN layout), with alpha the residual scale
and ``LN`` the LayerNorm that follows the residual sum (``ln_ffn``)::

    u = LN_attn(x)                                   attention input (queries, keys, values)
    Attn_i = sum_h sum_j w^h_ij (u_j W_V^h + b_V^h) W_O^h + b_O
    y_i = alpha * x_i + Attn_i                       the residual sum (the stream carries y on)
    x~_i = LN(y_i)                                   what the FFN reads

The residual branch is x_i itself (not LN_attn(x_i)): we decompose exactly what the model
computes. The other layouts fit the same form through ``AttentionRecord``: the reference
layout's residual branch is LN_attn(x) and its keys and values read x; the post-LN layout has
u = x and LN = ``ln_attn``, the LayerNorm right after the attention residual.
Components of position j in position i:

    a_ij = sum_h w^h_ij f^h_j,  f^h_j = (u_j W_V^h + b_V^h) W_O^h     (Attn stage)
    y_ij = a_ij + 1[j = i] alpha x_i                                  (+Res stage)
    g(z) = gamma * (z - mean(z)) / s(y_i),  s(y_i) = sqrt(Var(y_i) + eps)   (+LN stage)

so that sum_j a_ij + b_O = Attn_i, sum_j y_ij + b_O = y_i and
sum_j g(y_ij) + g(b_O) + beta = LN(y_i) exactly. The value bias b_V is inside every a_ij
(the weights of a row sum to 1); the output bias b_O and beta belong to no position and are
left out of the mixing ratios, as in the paper (beta) and the authors' code (b_O).

Mixing ratios of position i at a stage with components F_i(x_j):
    r_sum_i = sum_{j != i} ||F_i(x_j)|| / sum_j ||F_i(x_j)||                (paper, p. 5)
    r_agg_i = ||sum_{j != i} F_i(x_j)|| / (||sum_{j != i} F_i(x_j)|| + ||F_i(x_i)||)   (Eq. 22)

``decompose`` builds every component (B, L, L, D): the readable definition, used by the
tests. ``contribution_norms`` gets the same norms without the (B, L, L, D) tensor, from
per-position Gram matrices of the head outputs: ||sum_h w^h_ij f^h_j||^2 =
sum_{h,k} w^h_ij w^k_ij <f^h_j, f^k_j>, and the same with gamma * centred f for the LN stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from seqrec.models.sasrec import AttentionRecord

Stage = Literal["attn", "res", "ln"]
STAGES: tuple[Stage, ...] = ("attn", "res", "ln")
STAGE_LABELS = {"attn": "Attn", "res": "+Res", "ln": "+LN"}


@dataclass(frozen=True)
class Decomposition:
    """Every component of one block; sums reproduce the block's tensors (module docstring)."""

    attn: Tensor  # (B, L, L, D) a_ij, query i, key j
    res: Tensor  # (B, L, L, D) y_ij
    ln: Tensor  # (B, L, L, D) g(y_ij)
    attn_bias: Tensor  # (D,) b_O
    ln_bias: Tensor  # (B, L, D) g(b_O)
    beta: Tensor  # (D,)
    scale: Tensor  # (B, L) s(y_i)


@torch.no_grad()
def head_outputs(record: AttentionRecord) -> Tensor:
    """(B, H, L, D) f^h_j = v^h_j W_O^h: each head's value vectors through its slice of W_O."""
    H, dh = record.values.shape[1], record.values.shape[3]
    weight = record.attn.output_projection()[0]  # (D, H * dh); proj(y) = y @ weight.T + b_O
    per_head = weight.view(-1, H, dh).permute(1, 2, 0)  # (H, dh, D)
    return torch.einsum("bhjd,hde->bhje", record.values, per_head)


def layer_norm_scale(record: AttentionRecord) -> Tensor:
    """(B, L) s(y_i) = sqrt(Var(y_i) + eps), the scale LayerNorm divides by (biased variance)."""
    var = record.pre_ln.var(dim=-1, unbiased=False)
    return torch.sqrt(var + record.ln.eps)


def _g(z: Tensor, gamma: Tensor, scale: Tensor) -> Tensor:
    """gamma * (z - mean(z)) / s: z (..., D), scale broadcastable to z[..., 0]."""
    return gamma * (z - z.mean(dim=-1, keepdim=True)) / scale.unsqueeze(-1)


@torch.no_grad()
def decompose(record: AttentionRecord) -> Decomposition:
    """Every component a_ij, y_ij, g(y_ij) of one block (memory O(B L^2 D): small inputs)."""
    f = head_outputs(record)  # (B, H, L, D)
    attn = torch.einsum("bhij,bhjd->bijd", record.weights, f)  # (B, L, L, D)
    L = attn.size(1)
    eye = torch.eye(L, dtype=attn.dtype, device=attn.device)
    res = attn + record.residual_scale * eye[None, :, :, None] * record.x[:, :, None, :]
    scale = layer_norm_scale(record)  # (B, L)
    gamma, beta = record.ln.weight, record.ln.bias
    ln = _g(res, gamma, scale[:, :, None])
    bias = record.attn.output_projection()[1]
    ln_bias = _g(bias.expand_as(record.pre_ln), gamma, scale)
    return Decomposition(attn, res, ln, bias, ln_bias, beta, scale)


@dataclass(frozen=True)
class ContributionNorms:
    """Per stage: ``matrix`` (B, L, L) ||F_i(x_j)||, and ``context`` (B, L) the norm of the
    context sum ||sum_{j != i} F_i(x_j)||; the self term is the matrix diagonal."""

    matrix: dict[Stage, Tensor]
    context: dict[Stage, Tensor]


def _gram_norms(weights: Tensor, f: Tensor) -> Tensor:
    """(B, L, L) ||sum_h w^h_ij f^h_j|| from weights (B, H, L, L) and f (B, H, L, D)."""
    H = f.size(1)
    if H == 1:  # a single head: w_ij ||f_j||
        return weights[:, 0] * f[:, 0].norm(dim=-1)[:, None, :]
    gram = torch.einsum("bhjd,bkjd->bjhk", f, f)  # (B, L, H, H)
    squared = torch.einsum("bhij,bkij,bjhk->bij", weights, weights, gram)
    return squared.clamp_min(0).sqrt()


@torch.no_grad()
def contribution_norms(record: AttentionRecord) -> ContributionNorms:
    """The norms of ``decompose``'s components, computed in O(B L^2 H^2 + B L H D) memory."""
    w = record.weights  # (B, H, L, L)
    f = head_outputs(record)  # (B, H, L, D)
    gamma = record.ln.weight
    scale = layer_norm_scale(record)  # (B, L)
    diag_w = w.diagonal(dim1=-2, dim2=-1)  # (B, H, L)
    a_self = torch.einsum("bhi,bhid->bid", diag_w, f)  # (B, L, D) a_ii
    a_all = torch.einsum("bhij,bhjd->bid", w, f)  # (B, L, D) sum_j a_ij
    context = a_all - a_self  # (B, L, D), the same vector at every stage before LN
    y_self = a_self + record.residual_scale * record.x  # (B, L, D) y_ii

    attn = _gram_norms(w, f)  # (B, L, L)
    f_ln = gamma * (f - f.mean(dim=-1, keepdim=True))  # gamma * centred f: g is linear in it
    ln = _gram_norms(w, f_ln) / scale[:, :, None]
    res = attn.clone()
    idx = torch.arange(attn.size(1), device=attn.device)
    res[:, idx, idx] = y_self.norm(dim=-1)
    ln[:, idx, idx] = _g(y_self, gamma, scale).norm(dim=-1)
    context_norm = context.norm(dim=-1)
    return ContributionNorms(
        matrix={"attn": attn, "res": res, "ln": ln},
        context={
            "attn": context_norm,
            "res": context_norm,
            "ln": _g(context, gamma, scale).norm(dim=-1),
        },
    )


def _safe_div(num: Tensor, den: Tensor) -> Tensor:
    return torch.where(den > 0, num / den.clamp_min(torch.finfo(den.dtype).tiny), 0.0)


def mixing_ratios(norms: ContributionNorms, stage: Stage) -> tuple[Tensor, Tensor]:
    """(r_sum, r_agg), each (B, L), of every query position at ``stage``."""
    matrix = norms.matrix[stage]
    own = matrix.diagonal(dim1=-2, dim2=-1)  # (B, L)
    total = matrix.sum(dim=-1)
    context = norms.context[stage]
    return _safe_div(total - own, total), _safe_div(context, context + own)


def ratios_from_components(components: Tensor) -> tuple[Tensor, Tensor]:
    """(r_sum, r_agg), each (B, L), straight from the definitions: components (B, L, L, D)."""
    norms = components.norm(dim=-1)  # (B, L, L)
    own = norms.diagonal(dim1=-2, dim2=-1)
    L = components.size(1)
    off = ~torch.eye(L, dtype=torch.bool, device=components.device)
    context = (components * off[None, :, :, None]).sum(dim=2).norm(dim=-1)
    return _safe_div(norms.sum(dim=-1) - own, norms.sum(dim=-1)), _safe_div(context, context + own)
