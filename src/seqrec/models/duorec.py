"""DuoRec: SASRec with contrastive regularisation (Qiu, Huang, Yin & Wang, WSDM 2022).

Paper: "Contrastive Learning for Representation Degeneration Problem in Sequential
Recommendation", https://arxiv.org/abs/2110.05730 - reference code:
github.com/RuihongQiu/DuoRec (built on RecBole; RecBole ships the same model).

The encoder is SASRec's; the objective is the next-item loss (full softmax cross-entropy in
the paper) plus lambda * InfoNCE between two views of each training sequence, represented by
the hidden state at its newest position:
- unsupervised view: the same sequence encoded again, with other dropout masks
  (model-level augmentation);
- supervised view: another training sequence whose next item is the same target, encoded
  with dropout (``batch.same_target_ids``, provided when ``batch_needs`` asks for it).
DuoRec proper (``contrast: us_x``, the authors' setting) contrasts these two views. The
paper's ablations are available too: ``un`` contrasts the training pass with a second
dropout pass, ``su`` the training pass with the same-target sequence, ``us`` adds both terms.
The InfoNCE is SimCLR's over the 2B views of a batch: for each view, its partner is the
positive and the other 2B - 2 views are negatives, with similarity = dot product / tau.

Differences from the reference code, all deliberate:
- Views sharing a target with the anchor are removed from its negatives (they are false
  negatives: the supervised positive itself is such a sequence). The reference code keeps
  them; ``mask_same_target: false`` reproduces it.
- The encoder is the library's SASRec with all its switches (padded keys masked); the
  shipped configs use the SASRec+ block (kang205's layout and dropout placement) with the
  reference's N(0, 0.02) init and positions counted from the oldest item. The reference
  uses RecBole's BERT-style encoder (post-LayerNorm blocks, GELU FFN, LayerNorm on the input
  embeddings), which ``layout: post_ln``, ``dropout_placement: bert`` and ``activation:
  gelu`` reproduce. Sizes, dropout rate and the unscaled embeddings follow it.
- Training positions: the reference trains on every prefix of every sequence as a separate
  example, each with its own supervised positive and contrastive term (``examples:
  prefixes``). By default (``examples: rows``) a row trains its next-item loss at every
  position at once (the same examples, batched by user) and the contrastive term at its
  newest position, where the batch provides a same-target sequence. So an epoch has one
  contrastive example per user, not one per interaction, and fewer optimizer steps.
  Each contrastive example weighs what one next-item example weighs, as in the reference,
  where both terms are means over the same examples: the InfoNCE (a mean over the rows) is
  scaled by rows / next-item positions. Weighted as a mean over rows instead, the term is
  as many times stronger at the newest position as a row has positions, and it collapsed
  every newest state onto one vector (on Beauty, mean cosine 0.998 between random rows:
  ``benchmarks/duorec_views.py``).
- A row whose target occurs nowhere else in the training data is its own supervised
  positive (its own history, dropped out differently), as in the reference.
- ``contrast: us`` (an ablation) weighs its two terms with one ``contrastive_weight``; the
  reference's ``us`` weighs the unsupervised one with ``lmd`` and the supervised one with
  ``lmd_sem``, which differ only where those two are set apart.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from seqrec.batch import PAD_ID, BatchNeeds, ModelOutput, SeqBatch
from seqrec.config import ConfigError, check_float
from seqrec.models.base import register_model
from seqrec.models.objective import LossName, dot_product_loss
from seqrec.models.sasrec import SASRec, SASRecConfig
from seqrec.nn.row_gather import gather_rows

Contrast = Literal["us_x", "un", "su", "us"]


@dataclass(frozen=True, kw_only=True)
class DuoRecConfig(SASRecConfig):
    name: ClassVar[str] = "duorec"
    # Sizes of the reference's DuoRec.yaml and seq.yaml.
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2
    ffn_size: int | None = 256  # inner_size
    dropout: float = 0.5  # hidden_dropout_prob = attn_dropout_prob = 0.5
    scale_embedding: bool = False  # RecBole does not multiply embeddings by sqrt(d)
    loss: LossName = "ce"  # the paper's main term; any of the loss menu works
    # us_x: dropout view vs same-target view (DuoRec); un: training pass vs dropout view;
    # su: training pass vs same-target view; us: un + su.
    contrast: Contrast = "us_x"
    contrastive_weight: float = 0.1  # lambda (lmd_sem; lmd for the un term)
    temperature: float = 1.0  # tau
    similarity: Literal["dot", "cos"] = "dot"
    mask_same_target: bool = True  # same-target views are not negatives
    # "rows": a row per user, the next-item loss at every position and the contrastive term
    # at the newest; "prefixes": as the reference, every training prefix is an example with
    # its own next-item and contrastive terms (about L times more, smaller, steps per epoch).
    examples: Literal["rows", "prefixes"] = "rows"

    @property
    def loss_splits_by_rows(self) -> bool:
        # the contrastive term's negatives are the batch's other rows
        return self.contrastive_weight == 0.0 and super().loss_splits_by_rows

    @property
    def loss_gathers_rows(self) -> bool:
        # info_nce gathers the other ranks' views (and in_batch_negatives their targets)
        return self.contrastive_weight > 0.0 or super().loss_gathers_rows

    def __post_init__(self) -> None:
        super().__post_init__()
        check_float("model.contrastive_weight", self.contrastive_weight, at_least=0.0)
        check_float("model.temperature", self.temperature, above=0.0)
        if self.user_embedding:
            raise ConfigError("duorec has no user embedding; set model.user_embedding: false")
        if self.contrastive_weight == 0:
            self.warn_unread(
                ("contrast", "temperature", "similarity", "mask_same_target"),
                "with model.contrastive_weight: 0 (no contrastive term)",
            )

    @property
    def uses_same_target(self) -> bool:
        return self.contrastive_weight > 0.0 and self.contrast != "un"

    @property
    def batch_needs(self) -> BatchNeeds:
        return dataclasses.replace(
            super().batch_needs,
            same_target_sequences=self.uses_same_target,
            prefix_examples=self.examples == "prefixes",
        )


def info_nce(
    first: Tensor,
    second: Tensor,
    *,
    temperature: float,
    similarity: Literal["dot", "cos"] = "dot",
    targets: Tensor | None = None,
) -> Tensor:
    """SimCLR's NT-Xent over 2B views: (B, D), (B, D) -> scalar, mean over the 2B anchors.

    Row i of ``first`` and row i of ``second`` are a positive pair; every other view is a
    negative, except, when ``targets`` (B,) is given, views whose row has the same target.
    Under data-parallel training (``seqrec.nn.row_gather``) a rank's rows are its anchors and
    every rank's views its candidates: the ranks' means, weighted by their rows, are the mean
    over the whole batch's anchors.
    """
    rows = first.size(0)  # this rank's; B over every rank
    pairs, start = gather_rows(torch.cat([first, second], dim=1))  # (B, 2D), one gather
    B = pairs.size(0)
    z = torch.cat(pairs.chunk(2, dim=1)).float()  # (2B, D): every first view, then every second
    if similarity == "cos":
        z = F.normalize(z, dim=-1)
    mine = torch.arange(start, start + rows, device=z.device)
    anchors = torch.cat([mine, mine + B])  # this rank's views: all 2B in one process
    logits = z.index_select(0, anchors) @ z.T / temperature  # (anchors, 2B)
    partner = (anchors + B) % (2 * B)  # view i pairs with view i + B and back
    if targets is None:
        views = torch.arange(2 * B, device=z.device)
        excluded = anchors.unsqueeze(1) == views.unsqueeze(0)  # only the view itself
    else:
        both = gather_rows(targets)[0].repeat(2)  # (2B,)
        excluded = both[anchors].unsqueeze(1) == both.unsqueeze(0)  # includes the view itself
    excluded[torch.arange(2 * rows, device=z.device), partner] = False
    return F.cross_entropy(logits.masked_fill(excluded, float("-inf")), partner)


@register_model
class DuoRec(SASRec):
    config_class = DuoRecConfig
    config: DuoRecConfig

    def _same_target_state(self, batch: SeqBatch) -> Tensor:
        """(B, D) the supervised view: the newest state of each row's same-target sequence."""
        if batch.same_target_ids is None:
            raise ValueError(
                "DuoRec needs batch.same_target_ids (sequences with the same next item); "
                "build training batches with the model's batch_needs"
            )
        return self.newest_state(batch.same_target_ids)

    def contrastive_loss(self, batch: SeqBatch, trained: Tensor) -> Tensor:
        """The configured InfoNCE term(s); ``trained`` (B, D) is the training pass's view."""
        config = self.config
        if batch.labels is None:
            raise ValueError("DuoRec.contrastive_loss needs batch.labels")
        targets = batch.labels[:, -1] if config.mask_same_target else None

        def nce(first: Tensor, second: Tensor) -> Tensor:
            return info_nce(
                first,
                second,
                temperature=config.temperature,
                similarity=config.similarity,
                targets=targets,
            )

        if config.contrast == "un":
            return nce(trained, self.newest_state(batch.input_ids))
        if config.contrast == "su":
            return nce(trained, self._same_target_state(batch))
        if config.contrast == "us":
            unsupervised = nce(trained, self.newest_state(batch.input_ids))
            return unsupervised + nce(trained, self._same_target_state(batch))
        # us_x, DuoRec proper: a fresh dropout view against the same-target view
        return nce(self.newest_state(batch.input_ids), self._same_target_state(batch))

    def forward(self, batch: SeqBatch) -> ModelOutput:
        if batch.labels is None:
            raise ValueError("DuoRec.forward needs batch.labels")
        hidden, _ = self.encode(batch.input_ids)  # (B, L, D)
        labels = batch.labels[:, -hidden.size(1) :]
        next_item = dot_product_loss(self.config, hidden, labels, batch, self.output_embedding())
        if self.config.contrastive_weight == 0.0:
            return ModelOutput(loss=next_item, hidden=hidden)
        contrastive = self.contrastive_loss(batch, hidden[:, -1])
        # One contrastive example per row against one next-item example per real position
        # (1 in prefix examples): each example weighs the same, as in the reference.
        share = labels.size(0) / (labels != PAD_ID).sum().clamp(min=1)
        return ModelOutput(
            loss=next_item + self.config.contrastive_weight * share * contrastive,
            hidden=hidden,
            terms={"next_item": next_item, "contrastive": contrastive},
        )
