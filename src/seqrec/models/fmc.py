"""FMC: factorised first-order Markov chain, the item-to-item half of FPMC.

Paper: Rendle, Freudenthaler & Schmidt-Thieme, "Factorizing Personalized Markov Chains for
Next-Basket Recommendation", WWW 2010, https://doi.org/10.1145/1772690.1772773 (the FMC
baseline of its Sec. 5 and of the SASRec paper, Kang & McAuley, ICDM 2018). No reference
code was published; the SASRec paper used its own TensorFlow + Adam implementation.

score(j | last item i) = <N_i, M_j>, with separate ("unshared") matrices N (the item as the
previous one) and M (the item as the next one), so transitions can be asymmetric. This is
SASRec with 0 blocks, unshared embeddings and no positional embedding (SASRec paper, Sec. III).

Differences from the reference implementation, all deliberate:
- Sequences, not baskets: the "last basket" is the single previous item. Every position of
  a training sequence is one transition (previous item -> next item) with its loss.
- Adam on mini-batches of users instead of SGD on sampled (u, t, i, j) quadruples; one
  epoch visits every transition in the window once. Configs set ``max_seq_len`` above the
  longest history, so every transition is used.
- Negatives are items the user never interacted with (the library's sampler), where S-BPR
  samples items outside the current basket.
- The paper's L2 term is ``train.weight_decay`` (with ``optimizer: adamw``; see bpr.py).
- The loss menu applies; ``bpr`` (the paper's S-BPR for one basket item) is the default.
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
class FMCConfig(ItemLossConfig):
    name: ClassVar[str] = "fmc"
    hidden_size: int = 50  # d; the SASRec paper searched {10, ..., 50} for its baselines
    loss: LossName = "bpr"  # S-BPR; any of the loss menu

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.hidden_size < 1:
            raise ConfigError(f"model.hidden_size must be >= 1, got {self.hidden_size}")


@register_model
class FMC(ScoringRecommender):
    config_class = FMCConfig
    config: FMCConfig

    def __init__(self, config: FMCConfig) -> None:
        super().__init__(config)
        D = config.hidden_size
        self.prev_emb = nn.Embedding(config.num_items + 1, D, padding_idx=PAD_ID)  # N
        self.next_emb = nn.Embedding(config.num_items + 1, D, padding_idx=PAD_ID)  # M
        for emb in (self.prev_emb, self.next_emb):
            nn.init.normal_(emb.weight, std=INIT_STD)
            with torch.no_grad():
                emb.weight[PAD_ID].zero_()

    def forward(self, batch: SeqBatch) -> ModelOutput:
        if batch.labels is None:
            raise ValueError("FMC.forward needs batch.labels")
        # At every position the item there is "the last item" for the next one.
        hidden = self.prev_emb(batch.input_ids)  # (B, L, D) N_i
        loss = dot_product_loss(self.config, hidden, batch.labels, batch, self.next_emb.weight)
        return ModelOutput(loss=loss, hidden=hidden)

    def score(self, input_ids: Tensor, users: Tensor | None = None) -> Tensor:
        last = self.prev_emb(input_ids[:, -1])  # (B, D); left padding puts the newest last
        return last @ self.next_emb.weight.T  # (B, N + 1)
