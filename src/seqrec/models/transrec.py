"""TransRec: translation-based recommendation (He, Kang & McAuley, RecSys 2017).

Paper: https://arxiv.org/abs/1707.02410 - reference code (C++): linked from the paper at
sites.google.com/a/eng.ucsd.edu/ruining-he/. The SASRec paper (Kang & McAuley, ICDM 2018)
used its own TensorFlow + Adam implementation.

Items are points gamma_j in the unit ball of R^d; a user is a translation T_u = t + t_u (a
global t plus a personal offset t_u). The next item should lie near gamma_i + T_u:

    score(j | u, last item i) = beta_j - d(gamma_i + t + t_u, gamma_j)

with a per-item bias beta_j. The paper asks d to satisfy the triangle inequality (so that
"close to each other" is transitive) and names L1 or L2; ``distance: l2`` (the default) is
the Euclidean distance. ``distance: squared_l2`` (no triangle inequality, as some
reimplementations use) turns the score into a dot product of augmented vectors,
beta_j - ||a - g_j||^2 = <[2a, -||a||^2, 1], [g_j, 1, beta_j - ||g_j||^2]>, which is what
makes the full-softmax ``loss: ce`` possible; with ``l2`` it is refused.

Differences from the reference implementation, all deliberate:
- Items stay in the unit ball through a renormalisation in forward, gamma / max(1, ||gamma||),
  applied to the whole item matrix every time it is used, where the paper projects the
  updated rows after each SGD step. What the score sees is the same; the gradient also flows
  through the projection, and our trainer needs no model-specific post-step hook.
- Adam on mini-batches of users instead of SGD on sampled (u, i, j, j') examples; one epoch
  visits every transition in the window once. Configs set ``max_seq_len`` above the longest
  history, so every transition is used.
- Negatives are items the user never interacted with (the library's sampler).
- t and every t_u start at zero (a new user's translation is t, as in the paper); gamma
  starts at N(0, 0.1^2), inside the unit ball for d <= 100.
- The paper's L2 regulariser is ``train.weight_decay`` (with ``optimizer: adamw``; see
  bpr.py).
- The loss menu applies; ``bpr`` (the paper's S-BPR) is the default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqrec.batch import PAD_ID, ModelOutput, SeqBatch
from seqrec.config import ConfigError
from seqrec.models.base import ScoringRecommender, register_model
from seqrec.models.objective import (
    ItemLossConfig,
    LossName,
    Positions,
    batch_negatives,
    dot_product_loss,
    sampled_item_loss,
)

Distance = Literal["l2", "squared_l2"]
INIT_STD = 0.1  # N(0, 0.1^2) item points: norm about 0.1 sqrt(d) < 1 for d <= 100
EPS = 1e-12  # sqrt(max(x, EPS)): a finite gradient when a point coincides with the query


@dataclass(frozen=True, kw_only=True)
class TransRecConfig(ItemLossConfig):
    name: ClassVar[str] = "transrec"
    hidden_size: int = 50  # d; the SASRec paper searched {10, ..., 50} for its baselines
    distance: Distance = "l2"  # the paper's metric; squared_l2 also allows loss: ce
    loss: LossName = "bpr"  # S-BPR; any of the loss menu (ce only with squared_l2)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.hidden_size < 1:
            raise ConfigError(f"model.hidden_size must be >= 1, got {self.hidden_size}")
        if self.num_users < 1:
            raise ConfigError("model transrec needs the number of users from the data")
        if self.loss == "ce" and self.distance != "squared_l2":
            raise ConfigError(
                "model transrec: loss ce needs distance: squared_l2 (the full softmax over "
                "L2 distances is not a dot product); use a sampled loss with distance: l2"
            )


@register_model
class TransRec(ScoringRecommender):
    config_class = TransRecConfig
    config: TransRecConfig

    def __init__(self, config: TransRecConfig) -> None:
        super().__init__(config)
        D = config.hidden_size
        self.item_emb = nn.Embedding(config.num_items + 1, D, padding_idx=PAD_ID)  # gamma
        self.user_translation = nn.Embedding(config.num_users, D)  # t_u
        self.translation = nn.Parameter(torch.zeros(D))  # t, shared by every user
        self.item_bias = nn.Parameter(torch.zeros(config.num_items + 1))  # beta
        nn.init.normal_(self.item_emb.weight, std=INIT_STD)
        nn.init.zeros_(self.user_translation.weight)
        with torch.no_grad():
            self.item_emb.weight[PAD_ID].zero_()

    @property
    def uses_users(self) -> bool:
        return True

    def item_points(self) -> Tensor:
        """(N + 1, D) gamma_j / max(1, ||gamma_j||): every item inside the unit ball."""
        weight = self.item_emb.weight
        return weight / weight.norm(dim=1, keepdim=True).clamp_min(1.0)

    def _queries(self, items: Tensor, users: Tensor | None, gamma: Tensor) -> Tensor:
        """(B, L) or (B,) previous items -> gamma_i + t + t_u, (B, L, D) or (B, D)."""
        if users is None:
            raise ValueError("TransRec has user translations: pass the user indices")
        t_u = self.user_translation(users)  # (B, D)
        if items.dim() == 2:
            t_u = t_u.unsqueeze(1)
        return F.embedding(items, gamma) + self.translation + t_u

    def _distance(self, squared: Tensor) -> Tensor:
        return squared if self.config.distance == "squared_l2" else squared.clamp_min(EPS).sqrt()

    def forward(self, batch: SeqBatch) -> ModelOutput:
        if batch.labels is None:
            raise ValueError("TransRec.forward needs batch.labels")
        gamma = self.item_points()  # (N + 1, D)
        query = self._queries(batch.input_ids, batch.users, gamma)  # (B, L, D)
        if self.config.distance == "squared_l2":
            # beta_j - ||a - g_j||^2 as <[2a, -||a||^2], [g_j, 1]> + (beta_j - ||g_j||^2).
            hidden = torch.cat([2 * query, -query.square().sum(-1, keepdim=True)], dim=-1)
            items = torch.cat([gamma, gamma.new_ones(gamma.size(0), 1)], dim=1)
            bias = self.item_bias - gamma.square().sum(-1)
            loss = dot_product_loss(self.config, hidden, batch.labels, batch, items, bias)
        else:
            loss = self._l2_loss(query, batch, gamma)
        return ModelOutput(loss=loss, hidden=query)

    def _l2_loss(self, query: Tensor, batch: SeqBatch, gamma: Tensor) -> Tensor:
        """The sampled loss of beta_j - ||a - gamma_j|| at every real position."""
        assert batch.labels is not None
        positions = Positions.of(batch.labels)
        a = positions.select(query)  # (P, D)
        targets = positions.targets  # (P,)
        negatives = batch_negatives(self.config, batch, positions)  # (P, S)
        pos_sq = (a - F.embedding(targets, gamma)).square().sum(-1)  # (P,)
        neg_sq = (a.unsqueeze(1) - F.embedding(negatives, gamma)).square().sum(-1)  # (P, S)
        beta = self.item_bias
        pos = beta[targets] - self._distance(pos_sq)
        neg = beta[negatives] - self._distance(neg_sq)
        return sampled_item_loss(self.config, pos, neg, targets, negatives, batch.log_q)

    def score(self, input_ids: Tensor, users: Tensor | None = None) -> Tensor:
        gamma = self.item_points()  # (N + 1, D)
        a = self._queries(input_ids[:, -1], users, gamma)  # (B, D); the newest item is last
        # ||a - g||^2 = ||a||^2 - 2 a.g + ||g||^2 for the whole catalogue in one product.
        squared = a.square().sum(-1, keepdim=True) - 2 * a @ gamma.T + gamma.square().sum(-1)
        return self.item_bias - self._distance(squared.clamp_min(0.0))  # (B, N + 1)
