"""FPMC: factorising personalised Markov chains = matrix factorisation + FMC.

Paper: Rendle, Freudenthaler & Schmidt-Thieme, "Factorizing Personalized Markov Chains for
Next-Basket Recommendation", WWW 2010, https://doi.org/10.1145/1772690.1772773. No reference
code was published; the SASRec paper (Kang & McAuley, ICDM 2018) used its own TensorFlow +
Adam implementation.

score(j | u, last item i) = <U_u, V_j> + <N_i, M_j>: the paper's FPMC for a one-item basket
(the paper already drops the user-to-previous-item term, which does not depend on j). Four
separate matrices: V scores the next item against the user, M against the previous item.

Differences from the reference implementation, all deliberate:
- Sequences, not baskets: the previous basket is the single previous item, so the 1/|B|
  average over the basket is the one item. Every position of a training sequence is one
  (u, previous item -> next item) example with its loss.
- One width ``hidden_size`` for both factorisations (the paper allows k_UI != k_IL).
- Adam on mini-batches of users instead of SGD on sampled (u, t, i, j) quadruples; one
  epoch visits every transition in the window once. Configs set ``max_seq_len`` above the
  longest history, so every transition is used.
- S-BPR's negatives are items outside the current basket; ours are items the user never
  interacted with (the library's sampler).
- The paper's L2 term is ``train.weight_decay`` (with ``optimizer: adamw``; see bpr.py).
- The loss menu applies; ``bpr`` (the paper's S-BPR) is the default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from seqrec.batch import PAD_ID, ModelOutput, SeqBatch
from seqrec.config import ConfigError
from seqrec.models.base import ScoringRecommender, register_model
from seqrec.models.objective import ItemLossConfig, LossName, dot_product_loss

INIT_STD = 0.1  # N(0, 0.1^2) initial factors, the usual MF start (same as bpr.py)


@dataclass(frozen=True, kw_only=True)
class FPMCConfig(ItemLossConfig):
    name: ClassVar[str] = "fpmc"
    hidden_size: int = 50  # d of both factorisations; SASRec's baselines searched {10..50}
    loss: LossName = "bpr"  # S-BPR; any of the loss menu

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.hidden_size < 1:
            raise ConfigError(f"model.hidden_size must be >= 1, got {self.hidden_size}")
        if self.num_users < 1:
            raise ConfigError("model fpmc needs the number of users from the data")


@register_model
class FPMC(ScoringRecommender):
    config_class = FPMCConfig
    config: FPMCConfig

    def __init__(self, config: FPMCConfig) -> None:
        super().__init__(config)
        D, N = config.hidden_size, config.num_items
        self.user_emb = nn.Embedding(config.num_users, D)  # U (user -> item)
        self.user_item_emb = nn.Embedding(N + 1, D, padding_idx=PAD_ID)  # V (item <- user)
        self.prev_emb = nn.Embedding(N + 1, D, padding_idx=PAD_ID)  # N (item -> next item)
        self.next_emb = nn.Embedding(N + 1, D, padding_idx=PAD_ID)  # M (item <- previous)
        nn.init.normal_(self.user_emb.weight, std=INIT_STD)
        for emb in (self.user_item_emb, self.prev_emb, self.next_emb):
            nn.init.normal_(emb.weight, std=INIT_STD)
            with torch.no_grad():
                emb.weight[PAD_ID].zero_()

    @property
    def uses_users(self) -> bool:
        return True

    def _users(self, users: Tensor | None) -> Tensor:
        """(B,) user indices -> (B, D) U_u."""
        if users is None:
            raise ValueError("FPMC has a user embedding: pass the user indices")
        return self.user_emb(users)

    def output_embedding(self) -> Tensor:
        """(N + 1, 2D) [V_j, M_j]: <[U_u, N_i], [V_j, M_j]> is the FPMC score."""
        return torch.cat([self.user_item_emb.weight, self.next_emb.weight], dim=1)

    def forward(self, batch: SeqBatch) -> ModelOutput:
        if batch.labels is None:
            raise ValueError("FPMC.forward needs batch.labels")
        prev = self.prev_emb(batch.input_ids)  # (B, L, D) N_i, the item at each position
        user = self._users(batch.users).unsqueeze(1).expand_as(prev)  # (B, L, D) U_u
        hidden = torch.cat([user, prev], dim=-1)  # (B, L, 2D)
        loss = dot_product_loss(self.config, hidden, batch.labels, batch, self.output_embedding())
        return ModelOutput(loss=loss, hidden=hidden)

    def score(self, input_ids: Tensor, users: Tensor | None = None) -> Tensor:
        mf = self._users(users) @ self.user_item_emb.weight.T  # (B, N + 1)
        fmc = self.prev_emb(input_ids[:, -1]) @ self.next_emb.weight.T  # newest item last
        return mf + fmc
