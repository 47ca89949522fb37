"""Typed containers that cross layers: the training batch and the model output."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Literal

from torch import Tensor

PAD_ID = 0  # item id 0 is padding everywhere; real items are 1..num_items

# How training negatives are drawn: uniformly or by training popularity (both with
# replacement, excluding the user's own items), or taken from the other targets of the same
# batch; "distinct": S different items drawn uniformly without replacement from those outside
# the row's training window, one set per row (the sampler of Klenitskiy & Vasilev's SASRec+).
NegativeSampler = Literal["uniform", "popularity", "in_batch", "distinct"]


@dataclass(frozen=True)
class BatchNeeds:
    """What a model asks of its training batches beyond inputs and next-item labels."""

    num_negatives: int = 0  # sampled negatives per position (or per sequence when shared)
    negative_sampler: NegativeSampler = "uniform"
    shared_negatives: bool = False  # one set of negatives per sequence, (B, S) not (B, L, S)
    sampling_alpha: float = 1.0  # popularity sampling draws item j with p ~ count_j ** alpha
    log_q: bool = False  # attach log sampling probabilities for logQ correction
    same_target_sequences: bool = False  # DuoRec: another history with the same next item
    # One example per training position (every prefix of every sequence, its next item the
    # only label) instead of one row per user with a label at every position: models that
    # predict only after the whole history (TIGER's encoder-decoder).
    prefix_examples: bool = False


@dataclass(frozen=True)
class SeqBatch:
    """A left-padded batch of histories; the newest item is at index -1.

    input_ids: (B, L) item ids, PAD_ID on the left.
    labels: (B, L) next-item targets per position, PAD_ID = no loss at that position.
    negatives: (B, L, S) sampled negative items per position, or (B, S) shared by a row's
        positions (losses that need them).
    users: (B,) 0-based user indices (models with a user embedding).
    log_q: (N + 1,) log probability with which the batch's sampler draws each item as a
        negative (logQ correction); None means uniform, where the correction is a constant.
    same_target_ids: (B, L') left-padded history of another training sequence whose next
        item is the label at this row's last position (DuoRec's supervised positives).
    """

    input_ids: Tensor
    labels: Tensor | None = None
    negatives: Tensor | None = None
    users: Tensor | None = None
    log_q: Tensor | None = None
    same_target_ids: Tensor | None = None

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
    """What ``model(batch)`` returns in training: a scalar loss, plus optional hidden states
    and the named terms the loss combines (unweighted, for the training log: an objective
    with several parts, such as DuoRec's next-item and contrastive terms, reports each).

    ``num_targets``: how many positions the loss is a mean over, when they are not the
    batch's labelled positions (``SeqBatch.num_targets``): BERT4Rec's masked items, Caser's
    targets ahead. The training loop weighs a batch's parts (and data-parallel ranks) by it.
    """

    loss: Tensor
    hidden: Tensor | None = None
    terms: dict[str, Tensor] = field(default_factory=dict)
    num_targets: int | None = None
