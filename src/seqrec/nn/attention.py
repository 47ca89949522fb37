"""Scaled dot-product attention: the readable reference and the fast path, chosen explicitly."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from seqrec.nn.dropout import dropout, keep_mask, keep_scale
from seqrec.nn.masks import attention_bias

# An additive attention bias, or a tuple of additive terms that add up to it
Bias = Tensor | tuple[Tensor, ...]

# Attention weights per chunk of the CPU dropout path: about 1 MiB of float32, so that a
# chunk's logits, weights and their gradients stay in the core's cache between the passes.
_CHUNK_WEIGHTS = 1 << 18


def attention_reference(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor, dropout_p: float = 0.0, training: bool = False
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(d)) V, returning the attention weights (B, H, Lq, Lk) too.

    q: (B, H, Lq, D / H), k, v: (B, H, Lk, D / H); mask: broadcastable to (B, H, Lq, Lk),
    (B, 1, Lq, Lk) for a model's padding and causal masks, either bool (True = may attend) or its
    additive form (``seqrec.nn.masks.attention_bias``), as SDPA takes them.
    """
    logits = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Lq, Lk)
    logits = logits.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else logits + mask
    weights = logits.softmax(dim=-1)
    return dropout(weights, dropout_p, training) @ v, weights


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Bias,
    dropout_p: float = 0.0,
    training: bool = False,
) -> Tensor:
    """Same result as ``attention_reference`` (same dropout draws on CPU), faster.

    ``mask`` may also be a tuple of additive terms, each broadcastable to (B, H, Lq, Lk), that
    add up to the bias (T5's learned (1, H, Lq, Lk) positions and a (B, 1, Lq, Lk) padding
    mask): the CPU dropout path adds them a chunk at a time and never builds their (B, H, Lq,
    Lk) sum or its gradient; the other paths add them up first.

    Without dropout this is SDPA's fused kernel. With dropout on CPU, SDPA draws a Bernoulli
    per attention weight, which costs more than the attention itself; float32 inputs take
    ``_ChunkedDropoutAttention`` instead (BERT4Rec's ML-1M layer, 128 users x 2 heads x 200
    items: about 1.7x faster forward + backward than the reference), and other dtypes (bf16
    autocast) the reference with ``seqrec.nn.dropout``.
    """
    chunked = (
        dropout_p != 0.0
        and training
        and q.device.type == "cpu"
        and all(t.dtype == torch.float32 for t in (q, k, v))
        and not torch.is_autocast_enabled("cpu")
    )
    if chunked:
        terms = mask if isinstance(mask, tuple) else (mask,)
        terms = tuple(attention_bias(t, q.dtype) if t.dtype == torch.bool else t for t in terms)
        out: Tensor = _ChunkedDropoutAttention.apply(q, k, v, dropout_p, *terms)  # type: ignore[no-untyped-call]
        return out
    if isinstance(mask, tuple):
        mask = sum(mask[1:], mask[0])
    if dropout_p == 0.0 or not training:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    return attention_reference(q, k, v, mask, dropout_p, training)[0]


def _chunks(rows: int, weights_per_row: int) -> list[slice]:
    step = max(1, _CHUNK_WEIGHTS // weights_per_row)
    return [slice(start, start + step) for start in range(0, rows, step)]


class _ChunkedDropoutAttention(torch.autograd.Function):
    """``attention_reference`` with dropout, a few batch rows at a time.

    The reference makes about ten passes over the (B, H, Lq, Lk) weights (scale, mask,
    softmax, dropout, and their gradients), each from memory at long histories. Here each
    chunk's passes run while it is in cache; only the softmax weights and the keep mask are
    kept for the backward pass. The dropout mask is drawn for the whole batch up front,
    exactly as the reference draws it, and its 1 / (1 - p) scale is applied to V instead of
    the weights (the same product, rounded differently). Q is scaled before Q K^T likewise.
    The bias comes as additive terms, each added to a chunk's logits in turn.
    """

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, p: float, *terms: Tensor) -> Tensor:
        B, H, queries, d = q.shape
        keys = k.size(-2)
        scale = 1.0 / math.sqrt(d)
        keep = keep_mask((B, H, queries, keys), p, q.device)
        v_scale = keep_scale(p)
        v_scaled = v * v_scale
        weights = q.new_empty(B, H, queries, keys)
        out = q.new_empty(B, H, queries, v.size(-1))
        for rows in _chunks(B, H * queries * keys):
            logits = torch.matmul(q[rows] * scale, k[rows].transpose(-2, -1))
            for term in terms:
                logits.add_(_bias_rows(term, rows))
            torch.softmax(logits, dim=-1, out=weights[rows])
            kept = weights[rows] * keep[rows]
            torch.matmul(kept, v_scaled[rows], out=out[rows])
        ctx.save_for_backward(q, k, v_scaled, weights, keep, *terms)
        ctx.scales = (scale, v_scale)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Any, ...]:
        q, k, v_scaled, weights, keep, *terms = ctx.saved_tensors
        scale, v_scale = ctx.scales
        B, H, queries, keys = weights.shape
        grad_q, grad_k, grad_v = (torch.empty_like(t) for t in (q, k, v_scaled))
        # A learned term (T5's relative positions) gets the logits' gradient, summed over
        # the dimensions it is broadcast along.
        grad_terms = [
            torch.zeros_like(term) if needed else None
            for term, needed in zip(terms, ctx.needs_input_grad[4:], strict=True)
        ]
        for rows in _chunks(B, H * queries * keys):
            w, kept, g = weights[rows], keep[rows], grad_out[rows]
            torch.matmul((w * kept).transpose(-2, -1), g, out=grad_v[rows])
            grad_w = torch.matmul(g, v_scaled[rows].transpose(-2, -1)).mul_(kept)
            # softmax's backward: w * (grad_w - sum(grad_w * w))
            grad_logits = grad_w.sub_((grad_w * w).sum(-1, keepdim=True)).mul_(w)
            for term, grad_term in zip(terms, grad_terms, strict=True):
                if grad_term is not None:
                    term_rows = _bias_rows(term, rows)
                    _bias_rows(grad_term, rows).add_(grad_logits.sum_to_size(term_rows.shape))
            grad_logits.mul_(scale)
            torch.matmul(grad_logits, k[rows], out=grad_q[rows])
            torch.matmul(grad_logits.transpose(-2, -1), q[rows], out=grad_k[rows])
        return grad_q, grad_k, grad_v.mul_(v_scale), None, *grad_terms


def _bias_rows(bias: Tensor, rows: slice) -> Tensor:
    """The part of a bias broadcastable to (B, H, Lq, Lk) that applies to batch ``rows``."""
    return bias[rows] if bias.dim() == 4 and bias.size(0) > 1 else bias
