"""PopRec: recommend the items most often interacted with in training (sanity baseline).

Popularity is the number of times an item is a training target (every training item except
the first of each user's sequence); the model learns it by counting during ``forward``, over
training batches that hold every target once whatever ``max_seq_len`` and ``train.windows``
are (``ModelConfig.learns_by_counting``: the trainer cuts every sequence into windows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from seqrec.batch import PAD_ID, ModelOutput, SeqBatch
from seqrec.models.base import ModelConfig, ScoringRecommender, register_model


@dataclass(frozen=True, kw_only=True)
class PopConfig(ModelConfig):
    name: ClassVar[str] = "pop"
    learns_by_counting: ClassVar[bool] = True


@register_model
class PopRec(ScoringRecommender):
    config_class = PopConfig
    config: PopConfig

    def __init__(self, config: PopConfig) -> None:
        super().__init__(config)
        self.register_buffer("counts", torch.zeros(config.num_items + 1, dtype=torch.float64))
        self.counts: Tensor

    def forward(self, batch: SeqBatch) -> ModelOutput:
        if batch.labels is None:
            raise ValueError("PopRec.forward needs batch.labels")
        if self.training:
            labels = batch.labels[batch.labels != PAD_ID].long()
            self.counts += torch.bincount(labels, minlength=self.counts.numel()).to(self.counts)
        # Nothing to optimise: a zero loss keeps the training loop model-agnostic.
        return ModelOutput(loss=torch.zeros((), device=batch.labels.device))

    def score(self, input_ids: Tensor, users: Tensor | None = None) -> Tensor:
        return self.counts.float().unsqueeze(0).expand(input_ids.size(0), -1).clone()
