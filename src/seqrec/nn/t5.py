"""T5-style encoder-decoder layers (Raffel et al., JMLR 2020), as TIGER uses them.

Pre-norm residual blocks with RMS LayerNorm (no bias, no mean subtraction), bias-free
projections, a ReLU feed-forward, and T5's bucketed relative position bias, computed once per
stack and shared by its layers (bidirectional in the encoder, causal in the decoder).

One difference from T5: attention logits are scaled by 1/sqrt(head size) (T5 folds the scale
into its initialisation instead; with standard initialisation the scale keeps logits sane).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqrec.nn.attention import Bias, attention


def relative_position_bucket(
    relative: Tensor, *, bidirectional: bool, num_buckets: int, max_distance: int
) -> Tensor:
    """T5's buckets of ``relative = key - query``: exact for small distances, logarithmic
    up to ``max_distance``, one bucket beyond; the decoder (not bidirectional) folds the
    future (which its mask hides anyway) into bucket 0."""
    bucket = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        bucket += (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    exact = num_buckets // 2
    log_bucket = (
        exact
        + (
            torch.log(distance.float().clamp(min=1) / exact)
            / math.log(max_distance / exact)
            * (num_buckets - exact)
        ).long()
    )
    log_bucket = log_bucket.clamp(max=num_buckets - 1)
    return bucket + torch.where(distance < exact, distance, log_bucket)


class RelativePositionBias(nn.Module):
    """A learned scalar per (relative-position bucket, head), added to attention logits."""

    def __init__(
        self, num_heads: int, *, bidirectional: bool, num_buckets: int, max_distance: int
    ) -> None:
        super().__init__()
        self.bidirectional = bidirectional
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bias = nn.Embedding(num_buckets, num_heads)
        nn.init.normal_(self.bias.weight, std=0.1)

    def forward(self, query_len: int, key_len: int, query_offset: int = 0) -> Tensor:
        """-> (1, H, Tq, Tk); ``query_offset`` is the position of the first query."""
        device = self.bias.weight.device
        query = torch.arange(query_offset, query_offset + query_len, device=device)
        key = torch.arange(key_len, device=device)
        buckets = relative_position_bucket(
            key[None, :] - query[:, None],
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )
        return self.bias(buckets).permute(2, 0, 1).unsqueeze(0)


class Attention(nn.Module):
    """Multi-head attention with bias-free projections; ``bias`` is added to the logits."""

    def __init__(self, hidden_size: int, num_heads: int, head_size: int, dropout: float) -> None:
        super().__init__()
        self.num_heads, self.head_size = num_heads, head_size
        inner = num_heads * head_size
        self.query = nn.Linear(hidden_size, inner, bias=False)
        self.key = nn.Linear(hidden_size, inner, bias=False)
        self.value = nn.Linear(hidden_size, inner, bias=False)
        self.out = nn.Linear(inner, hidden_size, bias=False)
        self.dropout = dropout

    def heads(self, x: Tensor, projection: nn.Linear) -> Tensor:
        """(B, T, D) -> (B, H, T, head_size)."""
        B, T, _ = x.shape
        return projection(x).view(B, T, self.num_heads, self.head_size).transpose(1, 2)

    def forward(
        self,
        x: Tensor,
        bias: Bias,
        context: Tensor | None = None,
        keys: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """x (B, Tq, D) attends to ``context`` (B, Tk, D) (itself when None), or to
        precomputed ``keys`` = (K, V) each (B, H, Tk, head_size).

        bias: additive logits broadcastable to (B, H, Tq, Tk), -inf where not allowed, or a
        tuple of such terms that add up to them.
        """
        B, T, _ = x.shape
        if keys is None:
            source = x if context is None else context
            keys = (self.heads(source, self.key), self.heads(source, self.value))
        terms = tuple(t.to(x.dtype) for t in bias) if isinstance(bias, tuple) else bias.to(x.dtype)
        mixed = attention(self.heads(x, self.query), *keys, terms, self.dropout, self.training)
        return self.out(mixed.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self, hidden_size: int, ffn_size: int, dropout: float) -> None:
        super().__init__()
        self.inner = nn.Linear(hidden_size, ffn_size, bias=False)
        self.outer = nn.Linear(ffn_size, hidden_size, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.outer(self.dropout(F.relu(self.inner(x))))


class EncoderLayer(nn.Module):
    def __init__(
        self, hidden_size: int, num_heads: int, head_size: int, ffn_size: int, dropout: float
    ) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(hidden_size, eps=1e-6)
        self.attention = Attention(hidden_size, num_heads, head_size, dropout)
        self.ffn_norm = nn.RMSNorm(hidden_size, eps=1e-6)
        self.ffn = FeedForward(hidden_size, ffn_size, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, bias: Bias) -> Tensor:
        x = x + self.dropout(self.attention(self.attention_norm(x), bias))
        return x + self.dropout(self.ffn(self.ffn_norm(x)))


class DecoderLayer(nn.Module):
    """Causal self-attention over each beam's codes, cross-attention to the encoder, FFN.

    Inputs are (B, b, t, D): b beams (1 in training) of t decoder positions per user.
    Cross-attention flattens the beams into the query axis, so every beam of a user reads the
    user's one copy of the encoder keys and values (cached once per batch).
    """

    def __init__(
        self, hidden_size: int, num_heads: int, head_size: int, ffn_size: int, dropout: float
    ) -> None:
        super().__init__()
        self.self_norm = nn.RMSNorm(hidden_size, eps=1e-6)
        self.self_attention = Attention(hidden_size, num_heads, head_size, dropout)
        self.cross_norm = nn.RMSNorm(hidden_size, eps=1e-6)
        self.cross_attention = Attention(hidden_size, num_heads, head_size, dropout)
        self.ffn_norm = nn.RMSNorm(hidden_size, eps=1e-6)
        self.ffn = FeedForward(hidden_size, ffn_size, dropout)
        self.dropout = nn.Dropout(dropout)

    def cross_keys(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder output (B, T, D) -> this layer's cross-attention (K, V)."""
        return (
            self.cross_attention.heads(memory, self.cross_attention.key),
            self.cross_attention.heads(memory, self.cross_attention.value),
        )

    def forward(
        self, x: Tensor, self_bias: Tensor, cross_keys: tuple[Tensor, Tensor], cross_bias: Tensor
    ) -> Tensor:
        B, b, t, D = x.shape
        flat = x.reshape(B * b, t, D)
        flat = flat + self.dropout(self.self_attention(self.self_norm(flat), self_bias))
        per_user = flat.view(B, b * t, D)
        per_user = per_user + self.dropout(
            self.cross_attention(self.cross_norm(per_user), cross_bias, keys=cross_keys)
        )
        per_user = per_user + self.dropout(self.ffn(self.ffn_norm(per_user)))
        return per_user.view(B, b, t, D)
