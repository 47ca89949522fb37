"""What a model offers the residual-dominance diagnostics, and how they drive it.

A model opts in by meeting ``ResidualAnalyzable``: a causal self-attention encoder whose last
position is read out, with

- ``residual_scale``: a settable float alpha that scales the residual branch of every
  attention sublayer, h = alpha * x + Attn(x) (1.0 = the trained model; the FFN residual is
  never scaled);
- ``encode(input_ids, trace=records)``: all positions' hidden states (the scored output,
  after the final LayerNorm where the layout has one), appending one
  ``seqrec.models.sasrec.AttentionRecord`` per block to ``records``;
- ``output_embedding()``: the (N + 1, D) matrix whose rows score items, so position t's
  scores are ``hidden[:, t] @ output_embedding().T``.

SASRec implements it, and so do its subclasses (DuoRec, gSASRec). Nothing here copies a
model: alpha is set and restored on the model itself, and traces hold the tensors it used.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from seqrec.batch import PAD_ID
from seqrec.data.batches import left_padded
from seqrec.data.sequences import Sequences
from seqrec.models.base import SequentialRecommender
from seqrec.models.sasrec import AttentionRecord


@runtime_checkable
class ResidualAnalyzable(Protocol):
    """A causal self-attention model with last-position readout (see the module docstring)."""

    residual_scale: float

    def encode(
        self,
        input_ids: Tensor,
        need_weights: bool = False,
        last_only: bool = False,
        trace: list[AttentionRecord] | None = None,
    ) -> tuple[Tensor, list[Tensor]]: ...

    def output_embedding(self) -> Tensor: ...

    def score(self, input_ids: Tensor, users: Tensor | None = None) -> Tensor: ...


def analyzable(model: SequentialRecommender, users: bool = False) -> ResidualAnalyzable:
    """``model`` as a ``ResidualAnalyzable``, or a ValueError that says why it is not one.

    ``users``: accept a model with a user embedding (the attention maps do not score items;
    the residual diagnostics do, and refuse it).
    """
    name = model.config.name
    if not isinstance(model, ResidualAnalyzable):
        raise ValueError(
            f"this analysis needs a causal self-attention model with last-position readout "
            f"(sasrec, duorec, gsasrec); this run's model is {name!r}"
        )
    if model.uses_users and not users:
        raise ValueError(
            f"the residual diagnostics do not support a {name} with a user embedding "
            "(model.user_embedding: true)"
        )
    return model


@contextmanager
def residual_scale(model: ResidualAnalyzable, alpha: float) -> Iterator[ResidualAnalyzable]:
    """Run ``model`` with attention residuals scaled by ``alpha``; the old value comes back.

    >>> from seqrec.models.sasrec import SASRec, SASRecConfig
    >>> model = SASRec(SASRecConfig(num_items=5))
    >>> with residual_scale(model, 0.3):
    ...     model.residual_scale
    0.3
    >>> model.residual_scale
    1.0
    """
    before = model.residual_scale
    model.residual_scale = alpha
    try:
        yield model
    finally:
        model.residual_scale = before


def trace_encode(
    model: ResidualAnalyzable, input_ids: Tensor
) -> tuple[Tensor, list[AttentionRecord], Tensor]:
    """(B, L) ids -> hidden (B, L, D), one record per block, and the real-item mask (B, L).

    Uses the model's max_seq_len window (the model truncates the same way).
    """
    records: list[AttentionRecord] = []
    with torch.no_grad():  # not inference_mode: records meet parameters in later arithmetic
        hidden, _ = model.encode(input_ids, trace=records)
    window = input_ids[:, -hidden.size(1) :]
    return hidden, records, window != PAD_ID


def length_chunks(lengths: npt.NDArray[np.int64], size: int) -> list[npt.NDArray[np.int64]]:
    """Row indices sorted by length, in chunks of ``size``: a chunk pads to its own longest
    row (as the evaluator chunks)."""
    order = np.argsort(lengths, kind="stable")
    return [order[i : i + size] for i in range(0, len(order), size)]


def padded_batches(
    histories: Sequences, max_len: int, batch_size: int, device: torch.device | str = "cpu"
) -> Iterator[tuple[npt.NDArray[np.int64], Tensor]]:
    """(rows, (B, L) left-padded input ids) over every history, shortest first."""
    for chunk in length_chunks(histories.lengths, batch_size):
        yield chunk, torch.from_numpy(left_padded(histories, chunk, max_len)).to(device)
