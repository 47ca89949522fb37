"""BPR-MF: matrix factorisation trained with Bayesian personalised ranking (order-free).

Paper: Rendle, Freudenthaler, Gantner & Schmidt-Thieme, "BPR: Bayesian Personalized Ranking
from Implicit Feedback", UAI 2009, https://arxiv.org/abs/1205.2618 - reference code:
MyMediaLite's BPRMF (github.com/zenogantner/MyMediaLite). The SASRec paper (Kang & McAuley,
ICDM 2018) compared against its own TensorFlow + Adam implementation, which is unpublished.

score(j | u) = <U_u, V_j> + b_j: the history is ignored; only the user matters.

Differences from the reference implementation, all deliberate:
- Adam on mini-batches of users instead of SGD on bootstrap-sampled (u, i, j) triples; one
  epoch visits every training interaction of the window once, each with its own sampled
  negative(s) (but the window's last two positives, its last input item and its last label,
  which share one draw), as in the SASRec paper's Adam-trained baselines.
- Every training item in the window is a positive: the input items plus the last label, so a
  user's first item counts too (the next-item labels alone would skip it). Negatives are
  items the user never interacted with (the library's sampler), not merely "not i".
- Configs set ``max_seq_len`` above the longest history, so the window is the whole history.
- An item bias b_j (MyMediaLite's BPRMF has one; the paper's x_uij has none):
  ``item_bias: false`` gives the paper's pure inner product.
- The paper's L2 term lambda * ||theta||^2 is ``train.weight_decay`` (use ``optimizer:
  adamw``: with coupled Adam the L2 gradient of rows absent from a batch is rescaled into a
  full-size step towards zero, which erases rare items). The configs use none, as the SASRec
  paper reports no lambda for its baselines; early stopping regularises.
- The loss menu applies: ``bpr`` (the paper's) by default; BCE, sampled softmax, full CE,
  gBCE, BPR-max and TOP1-max score the same positives.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch
from torch import Tensor, nn

from seqrec.batch import PAD_ID, ModelOutput, SeqBatch
from seqrec.config import ConfigError
from seqrec.models.base import ScoringRecommender, register_model
from seqrec.models.objective import ItemLossConfig, LossName, dot_product_loss

INIT_STD = 0.1  # N(0, 0.1^2) initial factors, MyMediaLite's default InitStdDev


@dataclass(frozen=True, kw_only=True)
class BPRConfig(ItemLossConfig):
    name: ClassVar[str] = "bpr"
    targets_from_labels: ClassVar[bool] = False  # its positives are the window's inputs too
    hidden_size: int = 50  # d; the SASRec paper searched {10, ..., 50} for its baselines
    item_bias: bool = True  # + b_j; False is the paper's <U_u, V_j>
    loss: LossName = "bpr"  # the paper's pairwise loss; any of the loss menu

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.hidden_size < 1:
            raise ConfigError(f"model.hidden_size must be >= 1, got {self.hidden_size}")
        if self.num_users < 1:
            raise ConfigError("model bpr needs the number of users from the data")


@register_model
class BPRMF(ScoringRecommender):
    config_class = BPRConfig
    config: BPRConfig

    def __init__(self, config: BPRConfig) -> None:
        super().__init__(config)
        D = config.hidden_size
        self.user_emb = nn.Embedding(config.num_users, D)  # U
        self.item_emb = nn.Embedding(config.num_items + 1, D, padding_idx=PAD_ID)  # V
        self.item_bias = (
            nn.Parameter(torch.zeros(config.num_items + 1)) if config.item_bias else None
        )
        nn.init.normal_(self.user_emb.weight, std=INIT_STD)
        nn.init.normal_(self.item_emb.weight, std=INIT_STD)
        with torch.no_grad():
            self.item_emb.weight[PAD_ID].zero_()

    @property
    def uses_users(self) -> bool:
        return True

    def _users(self, users: Tensor | None) -> Tensor:
        """(B,) user indices -> (B, D) U_u."""
        if users is None:
            raise ValueError("BPR-MF scores users: pass the user indices")
        return self.user_emb(users)

    def forward(self, batch: SeqBatch) -> ModelOutput:
        if batch.labels is None:
            raise ValueError("BPRMF.forward needs batch.labels")
        # Positives: the window's input items plus the last label, i.e. every training item
        # of the window once; labels are row[1:], so they alone would skip the first item.
        positives = torch.cat([batch.input_ids, batch.labels[:, -1:]], dim=1)  # (B, L + 1)
        negatives = batch.negatives
        if negatives is not None and negatives.dim() == 3:  # (B, L, S): one more set
            negatives = torch.cat([negatives, negatives[:, -1:]], dim=1)  # any unseen item
        user = self._users(batch.users)  # (B, D)
        hidden = user.unsqueeze(1).expand(-1, positives.size(1), -1)  # (B, L + 1, D)
        loss = dot_product_loss(
            self.config,
            hidden,
            positives,
            replace(batch, negatives=negatives),
            self.item_emb.weight,
            self.item_bias,
        )
        return ModelOutput(loss=loss, num_targets=int((positives != PAD_ID).sum()))

    def score(self, input_ids: Tensor, users: Tensor | None = None) -> Tensor:
        scores = self._users(users) @ self.item_emb.weight.T  # (B, N + 1)
        if self.item_bias is not None:
            scores = scores + self.item_bias
        return scores
