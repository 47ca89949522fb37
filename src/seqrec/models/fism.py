"""FISM: factored item similarity models, read as a sequential model.

Paper: Kabbur, Ning & Karypis, "FISM: Factored Item Similarity Models for Top-N Recommender
Systems", KDD 2013, https://doi.org/10.1145/2487575.2487589. No reference code is mirrored
here; RecBole's FISM is a public reimplementation (order-free, full profiles).

The user is the normalised sum of the embeddings of the items they interacted with, scored
against a second, unshared item matrix (the paper's FISMauc estimate, without b_u):

    score(j | history S) = b_j + |S|^-alpha * sum_{i in S} <P_i, Q_j>

The SASRec paper (Kang & McAuley, ICDM 2018, Sec. III) reads FISM as SASRec with one attention
layer of uniform weights 1/|S|, unshared embeddings, no FFN and no positional embedding,
i.e. alpha = 1. As a sequential model, position t predicts item t + 1 from the prefix
S = items 1..t (a running sum: one cumsum, no loop), so the target is never in its own
history, which is the paper's "R_u \\ {j}" and its (n_u - 1)^-alpha.

Differences from the reference implementation, all deliberate:
- Causal prefixes: every position of a training sequence is a (history, next item)
  example. The paper uses the whole profile minus the target, whatever the order; at the
  last position (what ``score`` computes) the two agree. Configs set ``max_seq_len`` above
  the longest history, so the history is the whole profile.
- alpha = 0.5 by default, the middle of the [0, 1] range the paper sweeps and tunes per
  dataset. ``alpha: 1.0`` is the SASRec paper's uniform average.
- No user bias b_u: it does not change a user's ranking, and FISMauc's pairwise loss
  cancels it.
- Adam on mini-batches of users with the loss menu (``bpr`` by default, the log-sigmoid
  version of FISMauc's pairwise squared loss) instead of SGD on sampled pairs; negatives are
  items the user never interacted with. The paper's L2 terms (beta, lambda, gamma) are
  ``train.weight_decay`` (with ``optimizer: adamw``; see bpr.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqrec.batch import PAD_ID, ModelOutput, SeqBatch
from seqrec.config import ConfigError, check_float
from seqrec.models.base import ScoringRecommender, register_model
from seqrec.models.objective import ItemLossConfig, LossName, dot_product_loss

INIT_STD = 0.1  # N(0, 0.1^2) initial factors, the usual MF start (same as bpr.py)


@dataclass(frozen=True, kw_only=True)
class FISMConfig(ItemLossConfig):
    name: ClassVar[str] = "fism"
    hidden_size: int = 50  # d; the SASRec paper searched {10, ..., 50} for its baselines
    alpha: float = 0.5  # history normalisation |S|^-alpha: 0 = sum, 1 = mean
    loss: LossName = "bpr"  # pairwise, as FISMauc; any of the loss menu

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.hidden_size < 1:
            raise ConfigError(f"model.hidden_size must be >= 1, got {self.hidden_size}")
        check_float("model.alpha", self.alpha, at_least=0.0, at_most=1.0)


@register_model
class FISM(ScoringRecommender):
    config_class = FISMConfig
    config: FISMConfig

    def __init__(self, config: FISMConfig) -> None:
        super().__init__(config)
        D = config.hidden_size
        self.history_emb = nn.Embedding(config.num_items + 1, D, padding_idx=PAD_ID)  # P
        self.target_emb = nn.Embedding(config.num_items + 1, D, padding_idx=PAD_ID)  # Q
        self.item_bias = nn.Parameter(torch.zeros(config.num_items + 1))  # b_j
        for emb in (self.history_emb, self.target_emb):
            nn.init.normal_(emb.weight, std=INIT_STD)
            with torch.no_grad():
                emb.weight[PAD_ID].zero_()

    def _normalise(self, total: Tensor, count: Tensor) -> Tensor:
        """sum of P_i over a history (..., D) and its size (...) -> |S|^-alpha * sum."""
        scale = count.clamp_min(1).to(total.dtype).pow(-self.config.alpha)
        return total * scale.unsqueeze(-1)

    def encode(self, input_ids: Tensor) -> Tensor:
        """(B, L) left-padded ids -> (B, L, D) user vectors of every causal prefix."""
        real = input_ids != PAD_ID
        total = self.history_emb(input_ids).cumsum(dim=1)  # padding rows are zero
        return self._normalise(total, real.cumsum(dim=1))

    def forward(self, batch: SeqBatch) -> ModelOutput:
        if batch.labels is None:
            raise ValueError("FISM.forward needs batch.labels")
        hidden = self.encode(batch.input_ids)  # (B, L, D)
        loss = dot_product_loss(
            self.config, hidden, batch.labels, batch, self.target_emb.weight, self.item_bias
        )
        return ModelOutput(loss=loss, hidden=hidden)

    def score(self, input_ids: Tensor, users: Tensor | None = None) -> Tensor:
        # Only the whole history's sum is needed: a bag sum, no (B, L, D) tensor.
        total = F.embedding_bag(
            input_ids, self.history_emb.weight, mode="sum", padding_idx=PAD_ID
        )  # (B, D)
        user = self._normalise(total, (input_ids != PAD_ID).sum(dim=1))
        return user @ self.target_emb.weight.T + self.item_bias  # (B, N + 1)
