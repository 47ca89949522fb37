"""Training objectives as pure functions of logits and masks; models pick one by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

SampledLoss = Callable[[Tensor, Tensor], Tensor]
SampledLossName = Literal["bce", "sampled_softmax"]


def bce_with_negatives(pos_logits: Tensor, neg_logits: Tensor) -> Tensor:
    """SASRec's objective over real positions: pos (P,), neg (P, S) -> scalar.

    -[log sigma(r_pos) + sum_s log(1 - sigma(r_neg_s))], averaged over positions.
    """
    pos = F.softplus(-pos_logits)  # -log sigma(x)
    neg = F.softplus(neg_logits).sum(dim=-1)  # -log(1 - sigma(x))
    return (pos + neg).mean()


def sampled_softmax(pos_logits: Tensor, neg_logits: Tensor) -> Tensor:
    """Cross-entropy over {positive} + S negatives, positive at index 0: (P,), (P, S)."""
    logits = torch.cat([pos_logits.unsqueeze(-1), neg_logits], dim=-1)  # (P, 1 + S)
    return -logits.log_softmax(dim=-1)[:, 0].mean()


SAMPLED_LOSSES: dict[SampledLossName, SampledLoss] = {
    "bce": bce_with_negatives,
    "sampled_softmax": sampled_softmax,
}


def full_ce(logits: Tensor, labels: Tensor) -> Tensor:
    """Softmax cross-entropy over the whole catalogue: logits (P, N + 1), labels (P,).

    Column PAD_ID (0) must already be masked to -inf by the caller.
    """
    return F.cross_entropy(logits.float(), labels)
