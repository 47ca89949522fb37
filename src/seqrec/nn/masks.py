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
    much as the attention it serves.
    """
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask, zero, float("-inf"))
