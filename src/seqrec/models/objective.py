"""The loss menu: one config block and one function that every next-item scorer shares.

A model that scores item j at a position as a dot product <h, E_j> (plus an optional bias,
folded in as an extra dimension) inherits ``ItemLossConfig`` and calls ``dot_product_loss``;
a model with another score (TransRec's distance) calls ``sampled_item_loss`` with its own
``logits_for``. Which losses a model supports is declared on its config, so an impossible
choice fails when the config is built, not mid-training.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import ClassVar, Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor

from seqrec.batch import PAD_ID, BatchNeeds, NegativeSampler, SeqBatch
from seqrec.config import ConfigError, check_float
from seqrec.losses import (
    SampledLoss,
    bce_with_negatives,
    bpr,
    bpr_max,
    fused_full_ce,
    fused_grouped_sampled_softmax,
    gbce,
    sampled_softmax,
    top1_max,
)
from seqrec.models.base import ModelConfig
from seqrec.nn.row_gather import gather_rows

LossName = Literal["ce", "bce", "sampled_softmax", "gbce", "bpr", "bpr_max", "top1_max"]
ALL_LOSSES: tuple[LossName, ...] = get_args(LossName)
SAMPLED: tuple[LossName, ...] = tuple(name for name in ALL_LOSSES if name != "ce")


@dataclass(frozen=True, kw_only=True)
class ItemLossConfig(ModelConfig):
    """Loss fields of every next-item scorer; subclasses narrow ``supported_losses``."""

    supported_losses: ClassVar[tuple[LossName, ...]] = ALL_LOSSES
    # ce: full softmax over the catalogue; bce: SASRec's binary cross-entropy; sampled_softmax
    # (with logQ correction); gbce: gSASRec's generalised BCE; bpr / bpr_max / top1_max:
    # pairwise losses of BPR and GRU4Rec+.
    loss: LossName = "ce"
    num_negatives: int = 1  # per position, or per sequence with shared_negatives
    negative_sampler: NegativeSampler = "uniform"
    shared_negatives: bool = False  # a row's positions share one set of negatives
    sampling_alpha: float = 1.0  # popularity sampler: p(j) ~ count_j ** alpha
    logq_correction: bool = True  # sampled_softmax: subtract log q(j) from every logit
    gbce_t: float = 0.75  # gbce calibration t (0 = BCE)
    bpr_max_reg: float = 1.0  # bpr_max: weight of the score regulariser

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.loss not in self.supported_losses:
            raise ConfigError(
                f"model {self.name!r} cannot use loss {self.loss!r}; "
                f"it supports: {', '.join(self.supported_losses)}"
            )
        if self.num_negatives < 1:
            raise ConfigError(f"model.num_negatives must be >= 1, got {self.num_negatives}")
        check_float("model.gbce_t", self.gbce_t, at_least=0.0, at_most=1.0)
        check_float("model.sampling_alpha", self.sampling_alpha, at_least=0.0)
        check_float("model.bpr_max_reg", self.bpr_max_reg, at_least=0.0)
        if self.negative_sampler == "distinct" and not self.shared_negatives:
            raise ConfigError(
                "model.negative_sampler 'distinct' draws one set per sequence; "
                "set model.shared_negatives: true"
            )
        self._check_unread_loss_fields()

    def _unread_loss_fields(self) -> list[str]:
        """The loss fields that the chosen loss and sampler never read."""
        if self.loss == "ce":
            return [name for name in loss_fields() if name != "loss"]
        unread = {
            "logq_correction": self.loss != "sampled_softmax",
            "gbce_t": self.loss != "gbce",
            "bpr_max_reg": self.loss != "bpr_max",
            "sampling_alpha": self.negative_sampler != "popularity",
            "shared_negatives": self.negative_sampler == "in_batch",  # one set a batch anyway
        }
        return [name for name, is_unread in unread.items() if is_unread]

    def _check_unread_loss_fields(self) -> None:
        """A loss field set away from this model's default where nothing reads it changes
        nothing (num_negatives with loss: ce, say): ``warn_once`` says so."""
        self.warn_unread(
            self._unread_loss_fields(),
            f"with model.loss: {self.loss} and model.negative_sampler: {self.negative_sampler}",
        )

    @property
    def in_batch_negatives(self) -> bool:
        """A sampled loss whose negatives are the batch's other targets: it couples the rows
        (``loss_splits_by_rows`` is false for it)."""
        return self.loss != "ce" and self.negative_sampler == "in_batch"

    @property
    def loss_splits_by_rows(self) -> bool:
        # The menu's losses are means over positions of terms of their own row (a model whose
        # positions are not the labelled ones says so in ModelOutput.num_targets), except a
        # sampled loss over in-batch negatives. A model that couples rows otherwise overrides.
        return not self.in_batch_negatives

    @property
    def loss_gathers_rows(self) -> bool:
        return self.in_batch_negatives  # in_batch_negatives gathers every rank's targets

    @property
    def batch_needs(self) -> BatchNeeds:
        if self.loss == "ce":
            return BatchNeeds()
        in_batch = self.negative_sampler == "in_batch"
        corrected = self.loss == "sampled_softmax" and self.logq_correction
        return BatchNeeds(
            num_negatives=0 if in_batch else self.num_negatives,
            negative_sampler=self.negative_sampler,
            shared_negatives=self.shared_negatives,
            sampling_alpha=self.sampling_alpha,
            log_q=corrected and self.negative_sampler not in ("uniform", "distinct"),
        )


def loss_fields() -> tuple[str, ...]:
    """``ItemLossConfig``'s own fields: the loss menu's settings."""
    shared = {spec.name for spec in dataclasses.fields(ModelConfig)}
    return tuple(
        spec.name for spec in dataclasses.fields(ItemLossConfig) if spec.name not in shared
    )


# Set once the class exists (its fields are read off it), for every model of the loss menu.
ItemLossConfig.objective_fields = loss_fields()


def _sampled_loss(config: ItemLossConfig) -> SampledLoss:
    match config.loss:
        case "bce":
            return bce_with_negatives
        case "sampled_softmax":
            return sampled_softmax
        case "gbce":
            return partial(gbce, num_items=config.num_items, t=config.gbce_t)
        case "bpr":
            return bpr
        case "bpr_max":
            return partial(bpr_max, reg=config.bpr_max_reg)
        case "top1_max":
            return top1_max
    raise ConfigError(f"loss {config.loss!r} is not a sampled loss")


@dataclass(frozen=True)
class Positions:
    """The P real positions of a (B, L) label matrix, flattened."""

    where: Tensor  # (P,) indices into B * L
    rows: Tensor  # (P,) batch row of each position
    targets: Tensor  # (P,) next-item labels
    width: int  # L

    @classmethod
    def of(cls, labels: Tensor) -> Positions:
        where = (labels != PAD_ID).reshape(-1).nonzero().squeeze(1)
        targets = labels.reshape(-1).index_select(0, where).long()
        L = labels.size(1)
        return cls(where=where, rows=where // L, targets=targets, width=L)

    def select(self, per_position: Tensor) -> Tensor:
        """(B, L', *rest) with L' >= L, right-aligned -> (P, *rest)."""
        per_position = per_position[:, -self.width :]
        return per_position.reshape(-1, *per_position.shape[2:]).index_select(0, self.where)


def in_batch_negatives(config: ItemLossConfig, targets: Tensor) -> Tensor:
    """S of the batch's own targets, drawn with replacement and shared by every position
    (under data-parallel training: from every rank's targets, by each rank for its own).

    Their distribution is the target popularity, which logQ correction removes (with the
    counts of every training target, which is the pool's distribution only approximately:
    the pool holds the targets of the batch's windows, so with histories longer than
    max_seq_len the older targets are missing from it)."""
    pool, _ = gather_rows(targets)
    picks = torch.randint(pool.numel(), (config.num_negatives,), device=pool.device)
    return pool[picks]


def batch_negatives(config: ItemLossConfig, batch: SeqBatch, positions: Positions) -> Tensor:
    """(P, S) negative ids of every real position, whatever the sampler and sharing."""
    if config.negative_sampler == "in_batch":
        shared = in_batch_negatives(config, positions.targets)
        return shared.unsqueeze(0).expand(positions.targets.numel(), -1)
    if batch.negatives is None:
        raise ValueError(f"loss {config.loss!r} needs batch.negatives")
    if batch.negatives.dim() == 2:  # (B, S): one set per row
        return batch.negatives.index_select(0, positions.rows).long()
    return positions.select(batch.negatives).long()  # (B, L, S)


def sampled_item_loss(
    config: ItemLossConfig,
    pos_logits: Tensor,
    neg_logits: Tensor,
    targets: Tensor,
    negatives: Tensor,
    log_q: Tensor | None = None,
) -> Tensor:
    """The configured sampled loss of logits (P,), (P, S) for targets (P,), negatives (P, S).

    Negatives equal to the position's target are ignored; with ``sampled_softmax`` and a
    non-uniform sampler, log q(j) is subtracted from every logit (Yi et al., RecSys 2019).
    """
    if config.loss == "sampled_softmax" and config.logq_correction and log_q is not None:
        pos_logits = pos_logits - log_q[targets]
        neg_logits = neg_logits - log_q[negatives]
    valid = negatives != targets.unsqueeze(1)
    return _sampled_loss(config)(pos_logits, neg_logits, valid)


def _shared_negatives(
    config: ItemLossConfig, batch: SeqBatch, positions: Positions
) -> tuple[Tensor, Tensor] | None:
    """(groups (P,), negatives (G, S)) when positions share negatives: one set for the whole
    batch (in-batch) or one per row; None for negatives drawn per position."""
    if config.negative_sampler == "in_batch":
        shared = in_batch_negatives(config, positions.targets)
        return torch.zeros_like(positions.targets), shared.unsqueeze(0)
    if batch.negatives is not None and batch.negatives.dim() == 2:
        return positions.rows, batch.negatives.long()
    return None


def dot_product_loss(
    config: ItemLossConfig,
    hidden: Tensor,
    labels: Tensor,
    batch: SeqBatch,
    items: Tensor,
    bias: Tensor | None = None,
) -> Tensor:
    """The configured loss of scores <h, E_j> (+ b_j) at every real position.

    hidden: (B, L, D) states aligned with ``labels`` (B, L) (PAD_ID = no loss), both already
    cut to the model's window; items: (N + 1, D) output item matrix; bias: optional (N + 1,).
    """
    positions = Positions.of(labels)
    if bias is not None:  # <[h, 1], [E_j, b_j]> = <h, E_j> + b_j
        hidden = torch.cat([hidden, hidden.new_ones(*hidden.shape[:-1], 1)], dim=-1)
        items = torch.cat([items, bias.unsqueeze(1)], dim=1)
    h = positions.select(hidden)  # (P, D)
    targets = positions.targets
    if config.loss == "ce":
        return fused_full_ce(h, items, targets)
    shared = _shared_negatives(config, batch, positions)
    if config.loss == "sampled_softmax" and shared is not None:
        groups, negatives = shared
        log_q = batch.log_q if config.logq_correction else None
        return fused_grouped_sampled_softmax(h, items, targets, groups, negatives, log_q)
    pos = (h * F.embedding(targets, items)).sum(-1)  # (P,)
    if shared is None:  # (B, L, S) per position
        negatives = batch_negatives(config, batch, positions)
        neg = torch.einsum("pd,psd->ps", h, F.embedding(negatives, items))
    elif config.negative_sampler == "in_batch":  # one (P, D) x (D, S) product
        in_batch = shared[1].squeeze(0)  # (S,): the batch's single group
        neg = h @ F.embedding(in_batch, items).T
        negatives = in_batch.unsqueeze(0).expand_as(neg)
    else:  # (B, S) per row
        _, per_row = shared
        neg = positions.select(torch.bmm(hidden, F.embedding(per_row, items).transpose(1, 2)))
        negatives = per_row.index_select(0, positions.rows)
    return sampled_item_loss(config, pos, neg, targets, negatives, batch.log_q)
