"""Attention masks. Polarity everywhere: True = may attend / real item."""

from __future__ import annotations

import torch
from torch import Tensor


def attention_mask(padding_mask: Tensor, *, causal: bool) -> Tensor:
    """(B, L) bool, True = real item -> (B, 1, L, L) bool, True = query may attend to key.

    Every position may attend to itself, so no row is all-False: SDPA returns zeros for such a
    row while a hand-written softmax returns NaN, and padded rows are discarded anyway.
    """
    L = padding_mask.size(1)
    allowed = padding_mask[:, None, None, :]  # keys: (B, 1, 1, L)
    if causal:
        allowed = allowed & torch.ones(L, L, dtype=torch.bool, device=padding_mask.device).tril()
    return allowed | torch.eye(L, dtype=torch.bool, device=padding_mask.device)


def attention_bias(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A bool mask (True = may attend) -> the same mask as SDPA's additive form: 0 where
    allowed, -inf elsewhere, in ``dtype``.

    SDPA turns a bool mask into this form at every call; a model whose blocks share one mask
    converts it once. At long histories the conversion of a (B, 1, L, L) mask costs about as
    much as the attention it serves. For a padding mask, ``padding_bias`` builds the same
    bias directly; this conversion is its reference in the tests.
    """
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask, zero, float("-inf"))


def padding_bias(real: Tensor, *, causal: bool, dtype: torch.dtype) -> Tensor:
    """``attention_bias(attention_mask(real, causal=causal), dtype)``, (B, 1, L, L), built in
    one pass instead of three bool masks and a conversion: the padded keys' -inf (B, 1, 1, L)
    plus the future keys' -inf (L, L), then each padded query's own key set back to 0.

    At inference (2 blocks, 200 items, 64 users) the masks and their conversion took about
    a sixth of the time. Padded keys stay -inf: with a large finite value instead, evaluation
    measured slower (SDPA's CPU kernel appears to skip key blocks that are -inf throughout,
    which left padding makes common).
    """
    L = real.size(1)
    padded_keys = torch.zeros(real.size(0), 1, 1, L, dtype=dtype, device=real.device)
    padded_keys.masked_fill_(~real[:, None, None, :], float("-inf"))
    future = torch.zeros(L, L, dtype=dtype, device=real.device)
    if causal:
        ahead = torch.ones(L, L, dtype=torch.bool, device=real.device).triu(1)
        future.masked_fill_(ahead, float("-inf"))
    bias = padded_keys + future
    bias.diagonal(dim1=-2, dim2=-1).masked_fill_(~real[:, None, :], 0.0)  # padded: itself only
    return bias
