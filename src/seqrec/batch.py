"""Typed containers that cross layers: the training batch and the model output."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from torch import Tensor

PAD_ID = 0  # item id 0 is padding everywhere; real items are 1..num_items


@dataclass(frozen=True)
class SeqBatch:
    """A left-padded batch of histories; the newest item is at index -1.

    input_ids: (B, L) item ids, PAD_ID on the left.
    labels: (B, L) next-item targets per position, PAD_ID = no loss at that position.
    negatives: (B, L, S) sampled negative items per position (losses that need them).
    users: (B,) 0-based user indices (models with a user embedding).
    """

    input_ids: Tensor
    labels: Tensor | None = None
    negatives: Tensor | None = None
    users: Tensor | None = None

    def to(self, device: str | object) -> SeqBatch:
        moved = {
            f.name: getattr(self, f.name).to(device, non_blocking=True)
            for f in fields(self)
            if getattr(self, f.name) is not None
        }
        return replace(self, **moved)

    def pin_memory(self) -> SeqBatch:
        pinned = {
            f.name: getattr(self, f.name).pin_memory()
            for f in fields(self)
            if getattr(self, f.name) is not None
        }
        return replace(self, **pinned)

    @property
    def num_targets(self) -> int:
        """Positions that carry a loss (the unit of training throughput)."""
        if self.labels is None:
            return 0
        return int((self.labels != PAD_ID).sum())


@dataclass(frozen=True)
class ModelOutput:
    """What ``model(batch)`` returns in training: a scalar loss, plus optional hidden states."""

    loss: Tensor
    hidden: Tensor | None = None
