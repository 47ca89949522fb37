"""Scaled dot-product attention: the readable reference and the fast path, chosen explicitly."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from seqrec.nn.dropout import dropout


def attention_reference(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor, dropout_p: float = 0.0, training: bool = False
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(d)) V, returning the attention weights (B, H, L, L) too.

    q, k, v: (B, H, L, D / H); mask: (B, 1, L, L), either bool (True = may attend) or its
    additive form (``seqrec.nn.masks.attention_bias``), as SDPA takes them.
    """
    logits = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, L, L)
    logits = logits.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else logits + mask
    weights = logits.softmax(dim=-1)
    return dropout(weights, dropout_p, training) @ v, weights


def attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor, dropout_p: float = 0.0, training: bool = False
) -> Tensor:
    """Same result as ``attention_reference`` (same dropout draws on CPU), faster.

    Without dropout this is SDPA's fused kernel. With dropout on CPU, SDPA draws a Bernoulli
    per attention weight, which costs more than the attention itself; the explicit form with
    ``seqrec.nn.dropout`` is about 1.4x faster there.
    """
    if dropout_p == 0.0 or not training:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    return attention_reference(q, k, v, mask, dropout_p, training)[0]
