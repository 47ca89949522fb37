"""RecRec: Latent Interests Recursive Reasoning for Sequential Recommendation (RecSys 2026).

Specification: ``shared/specs/recrec.md`` (every equation below is numbered as there). No
reference code is public; the reasoning loop follows the Tiny Recursion Model (TRM,
Jolicoeur-Martineau 2025, arXiv:2510.04871), the compressor the Perceiver (Jaegle et al.,
ICML 2021), the gate Slot Attention (Locatello et al., NeurIPS 2020).

A wrapper over any backbone that turns a history into (B, L, D) hidden states H (SASRec or
BERT4Rec, built from the registry by name). Three spaces: H, the behaviour record; S, an
R x D scratchpad that is never decoded; M, R latent interests that predict. The Context
Compressor reads H into M_0; the Recursive Reasoner, one weight-shared Transformer block,
improves (S, M) one step at a time; items are scored by a log-mean-exp over the interests.
Training has two stages: ``stage: 1`` trains backbone + compressor on M_0 (CE + IDR);
``stage: 2`` (``train.init_from`` a stage-1 run) freezes both and trains the reasoner with
deep supervision. The inference depth N is ``depth``, an inference setting: evaluate and
recommend may change it on a trained model.

Choices the specification leaves open, and deviations, all deliberate:
- Training examples: with a causal backbone (SASRec) every position of a training row is
  an example whose history is its prefix (``train_positions: all``); the compressor and
  reasoner read H under a per-prefix mask, so H is encoded once per row. A bidirectional
  backbone (BERT4Rec) sees the future from every position but the newest, so it trains
  either on the newest position of each row only (``last``: one example per user and epoch,
  on which a BERT4Rec backbone overfits within a few epochs on Beauty) or on every training
  target as an example of its own, whose prefix the backbone encodes on its own
  (``prefixes``: every target, at the cost of one encoding per target).
- Stage 2 takes one optimizer step per batch on the mean of the K round losses by default
  (``supervision_updates: batch``; the K rounds see the same weights). TRM steps the
  optimizer after every round, so each round reads the reasoner the previous round's loss
  updated (``supervision_updates: round``, K steps a batch). The backbone
  runs in eval mode in stage 2 (frozen, no dropout; ``stage2_backbone_dropout`` keeps its
  dropout on, as stage 1 saw it); the compressor keeps its dropout.
- The gate ``gru`` is a GRU's update gate on layer-normalised M_hat and M_prev with M_hat
  as the candidate: M <- z M_prev + (1 - z) M_hat. A torch GRU cell on the normalised
  states (``gru_cell``, the literal reading) replaces M_0 by a re-normalised, tanh-bounded
  state at the first step, while the frozen item embeddings fix the logit scale: on ML-100K
  its stage 2 started far below stage 1 (valid NDCG@10 0.042 after one epoch against 0.087)
  and recovered slowly. With ``gru`` a step is the identity while the Reasoner is.
- ``compressor_recency`` and ``reasoner_recency`` (off by default, not in the
  specification) add a learned bias per head and distance to the scores of H's positions in
  the compressor's cross-attention and in the scratchpad's attention over H. Both read H as a
  set, and a SASRec backbone trained on every prefix numbers positions from the oldest item
  (so that a prefix's states do not depend on later items): nothing in H then marks which
  position is a history's newest, the item a last-position readout leans on most. The bias
  counts the distance from each history's newest position; it starts at zero.
- The BERT4Rec backbone is used without its [MASK] token and output head (RecRec's
  interests and scoring replace them); those weights are frozen and unused.
- Compressor and reasoner FFN widths, head counts, the compressor depth, lambda_IDR, tau
  and S_0's standard deviation (1, truncated at 2, as TRM's initial states) are not given
  by the specification; they are config fields with the defaults below.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal, Protocol, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqrec.batch import PAD_ID, BatchNeeds, ModelOutput, SeqBatch
from seqrec.config import ConfigError, check_float
from seqrec.models.backbone_options import backbone_config
from seqrec.models.base import (
    MODELS,
    ModelConfig,
    ScoringRecommender,
    SequentialRecommender,
    register_model,
)
from seqrec.nn.dropout import Dropout
from seqrec.nn.linear import Linear

BackboneName = Literal["sasrec", "bert4rec"]
Gate = Literal["gru", "gru_cell", "overwrite"]
# all: every prefix of a row from one encoding of it (a causal backbone); last: the newest
# position of each row; prefixes: every target an example, its prefix encoded on its own.
TrainPositions = Literal["all", "last", "prefixes"]
# When stage 2's optimizer steps: once a batch, on the mean of the K round losses; or after
# every round, as the Tiny Recursion Model's deep supervision does (the next round then runs
# with the updated reasoner).
SupervisionUpdates = Literal["batch", "round"]


class _TupleEncoder(Protocol):  # SASRec: encode -> (hidden, attention weights)
    def encode(self, input_ids: Tensor) -> tuple[Tensor, list[Tensor]]: ...


class _TensorEncoder(Protocol):  # BERT4Rec: encode -> hidden
    def encode(self, input_ids: Tensor) -> Tensor: ...


class _ItemScorer(Protocol):
    def output_embedding(self) -> Tensor: ...


@dataclass(frozen=True)
class Backbone:
    """What RecRec needs of a backbone: (B, L) ids -> (B, L, D) hidden states of the history."""

    hidden: Callable[[nn.Module, Tensor], Tensor]
    causal: bool  # position t's state depends on items <= t only
    unused: tuple[str, ...] = ()  # parameter name prefixes RecRec does not use (frozen)


BACKBONES: dict[BackboneName, Backbone] = {
    "sasrec": Backbone(lambda m, ids: cast(_TupleEncoder, m).encode(ids)[0], causal=True),
    "bert4rec": Backbone(
        lambda m, ids: cast(_TensorEncoder, m).encode(ids),
        causal=False,
        unused=("head.", "out_bias"),
    ),
}


# The fields only stage 2 (the reasoner and its training) reads.
STAGE_2_FIELDS = (
    "stage2_backbone_dropout",
    "inner_steps",
    "steps_per_round",
    "rounds",
    "gate",
    "reasoner_recency",
    "supervision_updates",
)


@dataclass(frozen=True, kw_only=True)
class RecRecConfig(ModelConfig):
    name: ClassVar[str] = "recrec"
    at_least_one: ClassVar[tuple[str, ...]] = (
        "num_interests",
        "compressor_layers",
        "attention_heads",
        "steps_per_round",
        "rounds",
    )
    inference_settings: ClassVar[tuple[str, ...]] = ("depth",)
    served_limits: ClassVar[Mapping[str, int]] = {"depth": 64}  # 4x the paper's deepest
    # A stage-2 run starts from a stage-1 run whose config may differ only here.
    warm_start_free: ClassVar[tuple[str, ...]] = (
        "stage",
        "depth",
        "train_positions",
        "dropout",
        "compressor_dropout",
        "stage2_backbone_dropout",
        "idr_weight",
        *STAGE_2_FIELDS,
    )
    backbone: BackboneName = "sasrec"
    hidden_size: int = 64  # d of the backbone, the interests and the reasoner
    num_layers: int = 2  # backbone blocks
    num_heads: int = 1  # backbone attention heads
    dropout: float = 0.2  # backbone dropout
    backbone_options: dict[str, Any] = field(default_factory=dict)  # other backbone fields
    stage: Literal[1, 2] = 1  # 1: backbone + compressor; 2: the reasoner, the rest frozen
    train_positions: TrainPositions = "all"  # which positions train (TrainPositions)
    num_interests: int = 8  # R
    compressor_layers: int = 2
    attention_heads: int = 2  # heads of the compressor's and the reasoner's attention
    # Inner width of the compressor's FFN (None = 4 d); the reasoner's SwiGLU gets 2/3 of it,
    # the same number of weights in its three matrices.
    ffn_size: int | None = None
    compressor_dropout: float = 0.1  # stays on in stage 2 (a regulariser)
    # A learned bias per head on the compressor's cross-attention scores, by a position's
    # distance from the history's newest item (zero at init: the specification's compressor).
    compressor_recency: bool = False
    # The same for the reasoner's attention of S over H (stage 2; zero at init).
    reasoner_recency: bool = False
    # Stage 2: the frozen backbone draws its dropout in training as in stage 1 (its hidden
    # states of the training prefixes are then noisy, as they were when it learned them).
    stage2_backbone_dropout: bool = False
    idr_weight: float = 0.1  # lambda_IDR; 0 switches the regulariser off (ablation)
    temperature: float = 1.0  # tau of s_r(v) = m_r . e_v / tau
    inner_steps: int = 3  # n: scratchpad updates per reasoning step (0: S stays S_0)
    steps_per_round: int = 3  # T: reasoning steps per supervision round, the last with grad
    rounds: int = 3  # K: supervision rounds; training depth N = K * T
    supervision_updates: SupervisionUpdates = "batch"  # optimizer steps: per batch or per round
    # How M_hat replaces M: "gru", a GRU update gate with M_hat as the candidate (identity
    # at init); "gru_cell", a torch GRU cell on layer-normalised M_hat and M (the literal
    # reading of the specification); "overwrite", M <- M_hat (ablation).
    gate: Gate = "gru"
    depth: int | None = None  # inference depth N; None = training depth (0 in stage 1)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.hidden_size % self.attention_heads != 0:
            raise ConfigError(
                f"model.hidden_size {self.hidden_size} must be divisible by "
                f"model.attention_heads {self.attention_heads}"
            )
        check_float("model.dropout", self.dropout, at_least=0.0, below=1.0)
        check_float("model.compressor_dropout", self.compressor_dropout, at_least=0.0, below=1.0)
        check_float("model.idr_weight", self.idr_weight, at_least=0.0)
        check_float("model.temperature", self.temperature, above=0.0)
        if self.depth is not None and self.depth < 0:
            raise ConfigError(f"model.depth must be >= 0 or null, got {self.depth}")
        if self.stage == 1 and self.depth:
            raise ConfigError(
                "a stage-1 RecRec has no reasoner, so model.depth must be 0 or null; "
                "train stage 2 (model.stage: 2, train.init_from: <stage-1 run>) to reason"
            )
        if self.train_positions == "all" and not BACKBONES[self.backbone].causal:
            raise ConfigError(
                f"backbone {self.backbone!r} is bidirectional: every position but the newest "
                "sees its own target, so it needs model.train_positions: last or prefixes"
            )
        if self.stage == 1:
            self.warn_unread(STAGE_2_FIELDS, "in stage 1, which has no reasoner")
        self.backbone_config()  # the backbone's own validation, now rather than at build

    @property
    def needs_init_from(self) -> str | None:
        if self.stage == 1:
            return None
        return (
            "a stage-2 RecRec trains only its reasoner, over the frozen backbone and compressor "
            "of a stage-1 run (random ones without it)"
        )

    @property
    def loss_splits_by_rows(self) -> bool:
        # Every example has its own history, and the loss is a mean over the examples
        # (ModelOutput.num_targets: with "last", one a row, not one a labelled position).
        return True

    @property
    def batch_needs(self) -> BatchNeeds:
        return replace(super().batch_needs, prefix_examples=self.train_positions == "prefixes")

    @property
    def updates_per_batch(self) -> int:
        return self.rounds if self.stage == 2 and self.supervision_updates == "round" else 1

    @property
    def inference_depth(self) -> int:
        if self.depth is not None:
            return self.depth
        return 0 if self.stage == 1 else self.rounds * self.steps_per_round

    def backbone_config(self) -> ModelConfig:
        """The backbone's own config: the shared fields plus ``backbone_options``."""
        try:
            cls = MODELS.get(self.backbone).config_class
        except KeyError:
            raise ConfigError(
                f"model.backbone {self.backbone!r} is not registered (the module "
                f"seqrec.models.{self.backbone} is missing); available: {', '.join(MODELS.names())}"
            ) from None
        config = backbone_config(cls, self, self.backbone_options)
        if getattr(config, "user_embedding", False):
            raise ConfigError(
                "model.backbone_options.user_embedding: RecRec reads only the backbone's "
                "hidden states, not a user embedding"
            )
        return config


# ------------------------------------------------------------------------------ losses
SCORE_BLOCK = 1 << 20  # logits per block of interest_scores: 4 MiB, about a core's cache
CE_ROWS = 128  # (position, interest) rows of logits per chunk of interest_ce


def interest_scores(interests: Tensor, items: Tensor, temperature: float) -> Tensor:
    """s(v) = log((1/R) sum_r exp(m_r . e_v / tau)): (B, R, D), (N + 1, D) -> (B, N + 1).

    A few users at a time: their (rows, R, N + 1) logits stay in cache for the logsumexp
    over R, and memory stays (B, N + 1). On one CPU thread with Beauty's 12,102 items and
    R = 8 this took about half the time of folding the R products in with pairwise
    logaddexp.
    """
    B, R, D = interests.shape
    V = items.size(0)  # N + 1 columns, padding included
    rows = B if interests.is_cuda else max(1, SCORE_BLOCK // (R * V))  # blocks suit a CPU cache
    scaled = items.T / temperature  # (D, N + 1)
    blocks = [
        torch.logsumexp((part.reshape(-1, D) @ scaled).view(-1, R, V), dim=1)
        for part in (interests[start : start + rows] for start in range(0, B, rows))
    ]
    if not blocks:
        return interests.new_empty(0, V)
    return torch.cat(blocks) - math.log(R)


def interest_ce_reference(
    interests: Tensor, items: Tensor, targets: Tensor, temperature: float
) -> Tensor:
    """Mean softmax cross-entropy of the log-mean-exp scores over items 1..N.

    interests: (P, R, D), items: (N + 1, D), targets: (P,) in 1..N.
    """
    logits = torch.einsum("prd,nd->prn", interests, items[1:]) / temperature  # (P, R, N)
    scores = logits.logsumexp(dim=1) - math.log(interests.size(1))  # (P, N)
    return F.cross_entropy(scores, targets - 1)


class _FusedInterestCE(torch.autograd.Function):
    """``interest_ce_reference`` with gradients computed chunk by chunk in the forward pass.

    CE = logsumexp_{r,v} s_r(v) - logsumexp_r s_r(v+) (the log R terms cancel), so
    dCE/ds_r(v) = softmax_{r,v} - [v = v+] softmax_r(s_r(v+)). The (P, R, N) logits are
    never stored; each chunk's gradient is multiplied straight into the input gradients.
    """

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        interests: Tensor,
        items: Tensor,
        targets: Tensor,
        temperature: float,
        chunk: int,
    ) -> Tensor:
        P, R, D = interests.shape
        catalogue = items[1:]  # (N, D)
        N = catalogue.size(0)
        grad_interests = torch.empty_like(interests) if ctx.needs_input_grad[0] else None  # type: ignore[attr-defined]
        grad_items = torch.zeros_like(items) if ctx.needs_input_grad[1] else None  # type: ignore[attr-defined]
        total = interests.new_zeros((), dtype=torch.float64)
        scaled = interests / temperature  # logits = (m / tau) . e: no pass over the logits
        for start in range(0, P, chunk):
            m = scaled[start : start + chunk]  # (c, R, D)
            c = m.size(0)
            target = (targets[start : start + chunk] - 1).view(c, 1, 1).expand(c, R, 1)
            logits = (m.reshape(c * R, D) @ catalogue.T).view(c, R * N)
            at_target = logits.view(c, R, N).gather(2, target).squeeze(2)  # (c, R)
            # softmax over (r, v) in place, keeping log sum exp = top + log(total)
            top = logits.amax(dim=1, keepdim=True)
            exps = logits.sub_(top).exp_()
            total_exp = exps.sum(dim=1, keepdim=True)
            lse = (top + total_exp.log()).squeeze(1)
            total += (lse - at_target.logsumexp(dim=1)).sum(dtype=torch.float64)
            if grad_interests is None and grad_items is None:
                continue
            grad = exps.div_(total_exp).view(c, R, N)  # the gradient, still unscaled by 1 / P
            grad.scatter_add_(2, target, -at_target.softmax(dim=1).unsqueeze(2))
            grad = grad.view(c * R, N)
            if grad_interests is not None:
                part = (grad @ catalogue).view(c, R, D)
                grad_interests[start : start + chunk] = part.div_(P * temperature)
            if grad_items is not None:
                grad_items[1:].addmm_(grad.T, m.reshape(c * R, D), alpha=1.0 / P)
        ctx.save_for_backward(grad_interests, grad_items)  # type: ignore[arg-type]
        return (total / P).to(interests.dtype)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_output: Tensor
    ) -> tuple[Tensor | None, Tensor | None, None, None, None]:
        grad_interests, grad_items = ctx.saved_tensors  # type: ignore[attr-defined]
        return (
            None if grad_interests is None else grad_interests * grad_output,
            None if grad_items is None else grad_items * grad_output,
            None,
            None,
            None,
        )


def interest_ce(interests: Tensor, items: Tensor, targets: Tensor, temperature: float) -> Tensor:
    """Same value and gradients as ``interest_ce_reference``, 128 (position, interest) rows
    of N logits at a time: a few MB, so the passes over them (max, exp, sum, divide) mostly
    hit the cache. On one CPU thread with Beauty's 12,101 items, training steps were 11%
    (stage 1) and 16% (stage 2) faster than with 1,024 rows."""
    chunk = max(1, CE_ROWS // interests.size(1))
    with torch.autocast(interests.device.type, enabled=False):  # float32 gradient buffers
        loss: Tensor = _FusedInterestCE.apply(  # type: ignore[no-untyped-call]
            interests.float(), items.float(), targets.long(), temperature, chunk
        )
    return loss


def interest_diversity(interests: Tensor) -> Tensor:
    """L_IDR = 1/(R(R-1)) sum_{r != r'} cos(m_r, m_r'), mean over examples: (P, R, D) -> ().

    Also the mean pairwise cosine of the interests that the report quotes. 0 when R = 1.
    """
    R = interests.size(1)
    if R < 2:
        return interests.new_zeros(())
    unit = F.normalize(interests.float(), dim=-1)
    gram = unit @ unit.transpose(1, 2)  # (P, R, R)
    off_diagonal = gram.sum(dim=(1, 2)) - gram.diagonal(dim1=1, dim2=2).sum(dim=1)
    return (off_diagonal / (R * (R - 1))).mean()


# ------------------------------------------------------------------------------ layers
def prefix_mask(real: Tensor, newest_only: bool) -> Tensor:
    """(B, L) real-item mask -> (B, G, L): which positions of H group g may read.

    Group g is the history ending at position g (G = L, a causal backbone's prefixes), or
    with ``newest_only`` the whole history (G = 1). A group always reads its own position,
    so a padded group (discarded later) is never fully masked.
    """
    L = real.size(1)
    own = torch.eye(L, dtype=torch.bool, device=real.device)
    if newest_only:
        return real.unsqueeze(1) | own[-1:]
    before = torch.ones(L, L, dtype=torch.bool, device=real.device).tril()  # [g, j]: j <= g
    return (real.unsqueeze(1) & before) | own


KeysValues = tuple[Tensor, Tensor]  # keys and values, (B, H, ..., T, D / H) each


# Groups per block of Reads. 32 and 64 timed alike on one ML-1M stage-2 batch part (one
# thread, an ad-hoc profile); 32 skips more of the causal future.
GROUP_BLOCK = 32


@dataclass(frozen=True)
class Reads:
    """Which positions of H each group reads: ``mask`` (B, G, L), or (P, 1, L) for packed
    groups, and the groups in blocks, each with the span of positions that some group of
    the block reads in some row.

    Groups never read each other, so the compressor and the reasoning step run block by
    block, and attention over H scores a block only inside its span. That skips the future
    positions of a causal backbone's earlier prefixes and the left padding shared by a batch
    part: on ML-1M (n = 200, 7 blocks of 32 prefixes) 42% of the scores of a fully labelled
    part. Built once per batch (one synchronisation)."""

    mask: Tensor
    blocks: tuple[tuple[slice, slice], ...]  # (groups, positions)

    @classmethod
    def of(cls, mask: Tensor, block: int = GROUP_BLOCK) -> Reads:
        G, L = mask.shape[1:]
        readable = mask.any(dim=0)  # (G, L): read by group g of some row
        starts = range(0, G, block)
        spans = torch.stack([readable[start : start + block].any(dim=0) for start in starts])
        first = spans.int().argmax(dim=1)  # every group reads at least its own position
        end = L - spans.flip(1).int().argmax(dim=1)
        return cls(
            mask,
            tuple(
                (slice(start, start + block), slice(lo, hi))
                for start, lo, hi in zip(starts, first.tolist(), end.tolist(), strict=True)
            ),
        )

    def split(self) -> Iterator[tuple[slice, Reads]]:
        """Each block's groups, and their reads as a single block."""
        for groups, span in self.blocks:
            yield groups, Reads(self.mask[:, groups], ((slice(None), span),))


def concat(blocks: list[Tensor], dim: int) -> Tensor:
    """Blocks of groups put back together (a single block as it is, without a copy)."""
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=dim)


def select_rows(keys: KeysValues, rows: Tensor | None) -> KeysValues:
    """Keys of H for packed groups: (B, H, L, d) each -> (P, H, L, d), the row of each group.

    Projecting H once per row and copying the keys to its groups costs far less than
    projecting a copy of H for every group."""
    if rows is None:
        return keys
    return keys[0].index_select(0, rows), keys[1].index_select(0, rows)


# A part of a batch whose (B, G) grid is less than this fraction labelled trains on its
# groups packed. Packing skips the padded groups but copies H's keys to every group, which
# costs more the longer the histories: on one thread, 8 parts per batch, packing every part
# made Beauty (n = 50, 61% labelled) 12% (stage 1) and 21% (stage 2) faster, and ML-1M
# (n = 200, 91% labelled) 1.7x and 1.2x slower.
PACK_BELOW = 0.65


@dataclass(frozen=True)
class Encoded:
    """A batch of histories read by the compressor.

    The groups (histories that get interests) are either every (row, g) of a (B, G) grid or,
    packed, only the labelled ones: (P, 1), with ``rows`` the row of H each one reads.
    Training packs them when much of the grid is padding (``PACK_BELOW``)."""

    hidden: Tensor  # H, (B, L, D)
    reads: Reads  # which positions of its row of H each group reads
    rows: Tensor | None  # (P,) when packed, else None
    interests: Tensor  # M_0, (B, G, R, D) or (P, 1, R, D)

    def examples(self, states: Tensor, groups: Tensor) -> Tensor:
        """The (P, R, D) states of the ``groups`` (B, G) from (B, G, R, D) or packed states."""
        return states[:, 0] if self.rows is not None else states[groups]


class GroupAttention(nn.Module):
    """Multi-head attention of (B, G, R, D) queries over the union of two key sets: keys of
    their own group (B, H, G, C, d), and keys shared by all groups of a row (B, H, L, d),
    each group reading the shared positions that ``reads`` allows. One softmax runs over
    both sets; keys are projected by ``keys`` so that callers can reuse them."""

    def __init__(self, D: int, num_heads: int, bias: bool) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q = Linear(D, D, bias=bias)
        self.kv = Linear(D, 2 * D, bias=bias)
        self.proj = Linear(D, D, bias=bias)

    def keys(self, x: Tensor) -> KeysValues:
        """(B, ..., T, D) -> keys and values (B, H, ..., T, D / H)."""
        kv = self.kv(x).view(*x.shape[:-1], 2, self.num_heads, -1)
        return kv[..., 0, :, :].movedim(-2, 1), kv[..., 1, :, :].movedim(-2, 1)

    def forward(
        self,
        x: Tensor,
        own: KeysValues | None,
        shared: KeysValues | None = None,
        reads: Reads | None = None,
        recency: Tensor | None = None,
    ) -> Tensor:
        """``recency`` (H, distances), with shared keys only: added to the scores of a shared
        position by its distance from the newest position its group reads."""
        B, G, R, D = x.shape
        H = self.num_heads
        q = self.q(x).view(B, G, R, H, D // H).movedim(3, 1) / math.sqrt(D // H)  # (B, H, G, R, d)
        if shared is None:
            assert own is not None
            out = q @ own[0].transpose(-1, -2)  # (B, H, G, R, C)
            out = out.softmax(dim=-1) @ own[1]
        else:
            assert reads is not None
            out = concat(
                [
                    self._block(
                        q[:, :, groups],
                        None if own is None else (own[0][:, :, groups], own[1][:, :, groups]),
                        shared,
                        block,
                        recency,
                    )
                    for groups, block in reads.split()
                ],
                dim=2,
            )
        return self.proj(out.movedim(1, 3).reshape(B, G, R, D))

    @staticmethod
    def _block(
        q: Tensor,
        own: KeysValues | None,
        shared: KeysValues,
        block: Reads,
        recency: Tensor | None = None,
    ) -> Tensor:
        """The attention of the queries (B, H, g, R, d) of one block of groups over their own
        keys and the shared positions of the block's span, outside which they read nothing."""
        B, H, g, R, d = q.shape
        ((_, span),) = block.blocks
        keys, values = shared[0][:, :, span], shared[1][:, :, span]
        s = q.reshape(B, H, g * R, d) @ keys.transpose(-1, -2)  # (B, H, g * R, l)
        s = s.view(B, H, g, R, -1)
        if recency is not None:
            s = s + recency_bias(recency, block.mask, span)
        s.masked_fill_(~block.mask[:, None, :, None, span], float("-inf"))
        if own is None:
            weights = s.softmax(dim=-1)
            return (weights.view(B, H, g * R, -1) @ values).view(B, H, g, R, d)
        own_keys, own_values = own
        C = own_keys.size(-2)
        scores = torch.cat([q @ own_keys.transpose(-1, -2), s], dim=-1)  # (B, H, g, R, C + l)
        to_own, to_shared = scores.softmax(dim=-1).split_with_sizes([C, s.size(-1)], dim=-1)
        from_shared = to_shared.reshape(B, H, g * R, -1) @ values
        return to_own @ own_values + from_shared.view(B, H, g, R, d)


def recency_bias(recency: Tensor, mask: Tensor, span: slice) -> Tensor:
    """Scores to add for the positions ``span`` of H: (H, n) biases by distance from each
    group's newest position, (B, g, L) reads -> (B, H, g, 1, span). Every group reads its own
    position, its newest: that of its prefix, the row's newest, or a packed group's own."""
    L = mask.size(-1)
    newest = L - 1 - mask.flip(-1).int().argmax(dim=-1)  # (B, g)
    positions = torch.arange(L, device=mask.device)[span]
    distance = (newest.unsqueeze(-1) - positions).clamp_(0, recency.size(1) - 1)  # (B, g, l)
    return recency[:, distance].movedim(0, 1).unsqueeze(3)


def recency_parameter(config: RecRecConfig, enabled: bool) -> nn.Parameter | None:
    """The biases of ``recency_bias``, (heads, max_seq_len) zeros, or None when switched off."""
    if not enabled:
        return None
    return nn.Parameter(torch.zeros(config.attention_heads, config.max_seq_len))


class CompressorLayer(nn.Module):
    """Z <- Z + CrossAttn(LN(Z), H_bar, H_bar); Z <- Z + SelfAttn(LN(Z)); Z <- Z + FFN(LN(Z))."""

    def __init__(self, config: RecRecConfig) -> None:
        super().__init__()
        D = config.hidden_size
        inner = config.ffn_size or 4 * D
        self.ln_crossattn = nn.LayerNorm(D)
        self.crossattn = GroupAttention(D, config.attention_heads, bias=True)
        self.ln_selfattn = nn.LayerNorm(D)
        self.selfattn = GroupAttention(D, config.attention_heads, bias=True)
        self.ln_ffn = nn.LayerNorm(D)
        self.ffn = nn.Sequential(Linear(D, inner), nn.GELU(), Linear(inner, D))
        self.dropout = Dropout(config.compressor_dropout)
        self.recency = recency_parameter(config, config.compressor_recency)

    def forward(self, z: Tensor, keys: KeysValues, reads: Reads) -> Tensor:
        """z: (B, G, R, D); keys: the cross-attention's keys of H_bar (``crossattn.keys``)."""
        attended = self.crossattn(self.ln_crossattn(z), None, keys, reads, self.recency)
        z = z + self.dropout(attended)
        y = self.ln_selfattn(z)
        # among the R interests of a group: no positions, no mask
        z = z + self.dropout(self.selfattn(y, self.selfattn.keys(y)))
        return z + self.dropout(self.ffn(self.ln_ffn(z)))


class ContextCompressor(nn.Module):
    """R learned queries read H (Perceiver-style): (B, L, D), (B, G, L) -> M_0 (B, G, R, D),
    or with ``rows`` (P,) the packed groups (P, 1, L) -> (P, 1, R, D).

    Groups never read each other, so they run block by block of ``reads``, each block's
    activations staying in cache; H's keys are projected once per layer for all blocks."""

    def __init__(self, config: RecRecConfig) -> None:
        super().__init__()
        self.queries = nn.Parameter(torch.empty(config.num_interests, config.hidden_size))
        self.ln_input = nn.LayerNorm(config.hidden_size)
        self.layers = nn.ModuleList(
            CompressorLayer(config) for _ in range(config.compressor_layers)
        )

    def forward(self, hidden: Tensor, reads: Reads, rows: Tensor | None = None) -> Tensor:
        h_bar = self.ln_input(hidden)  # computed once, shared by every layer
        layers = cast(list[CompressorLayer], list(self.layers))
        keys = [select_rows(layer.crossattn.keys(h_bar), rows) for layer in layers]
        blocks = []
        for _, block in reads.split():
            z = self.queries.expand(*block.mask.shape[:2], *self.queries.shape)
            for layer, layer_keys in zip(layers, keys, strict=True):
                z = layer(z, layer_keys, block)
            blocks.append(z)
        return concat(blocks, dim=1)


class SwiGLU(nn.Module):
    """W_2 (SiLU(W_1 x) * W_3 x), bias-free."""

    def __init__(self, D: int, inner: int) -> None:
        super().__init__()
        self.w1 = Linear(D, inner, bias=False)
        self.w3 = Linear(D, inner, bias=False)
        self.w2 = Linear(inner, D, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Reasoner(nn.Module):
    """One pre-norm block, the same weights for S and for M:
    X' = X + Attn(LN_q(X), [LN_q(X); LN_kv(C)]);  Reasoner(X, C) = X' + FFN(LN_ffn(X')).

    The context C is own-group states (M for S, S for M) and, for S, the behaviour record H
    shared by the groups of a row. ``context`` projects a context's keys once, so M's are
    reused by the n scratchpad updates of a step and H's by every step of a batch.
    Output projections start at zero, so the block starts as the identity.
    """

    def __init__(self, config: RecRecConfig) -> None:
        super().__init__()
        D = config.hidden_size
        self.ln_q = nn.LayerNorm(D)
        self.ln_kv = nn.LayerNorm(D)
        self.attn = GroupAttention(D, config.attention_heads, bias=False)
        self.ln_ffn = nn.LayerNorm(D)
        self.ffn = SwiGLU(D, max(1, 2 * (config.ffn_size or 4 * D) // 3))
        self.recency = recency_parameter(config, config.reasoner_recency)

    def context(self, states: Tensor) -> KeysValues:
        """(B, ..., T, D) context states -> keys and values of LN_kv(states)."""
        return self.attn.keys(self.ln_kv(states))

    def forward(
        self,
        x: Tensor,
        context: KeysValues,
        shared: KeysValues | None = None,
        reads: Reads | None = None,
    ) -> Tensor:
        """x: (B, G, R, D); context: own-group keys (``context``); shared: H's keys."""
        query = self.ln_q(x)
        k, v = self.attn.keys(query)
        own = torch.cat([k, context[0]], dim=-2), torch.cat([v, context[1]], dim=-2)
        x = x + self.attn(query, own, shared, reads, self.recency)  # keys: [LN_q(X); LN_kv(C)]
        return x + self.ffn(self.ln_ffn(x))


class InterestGate(nn.Module):
    """M <- z * M_prev + (1 - z) * M_hat, z = sigmoid(W [LN(M_hat); LN(M_prev)] + b): a GRU's
    update gate, computed from layer-normalised inputs, with M_hat itself as the candidate.

    The reasoning step is then the identity whenever the Reasoner is (at initialisation).
    """

    def __init__(self, D: int) -> None:
        super().__init__()
        self.ln_update = nn.LayerNorm(D)
        self.ln_state = nn.LayerNorm(D)
        self.update_gate = Linear(2 * D, D)

    def forward(self, update: Tensor, state: Tensor) -> Tensor:
        inputs = torch.cat([self.ln_update(update), self.ln_state(state)], dim=-1)
        keep = torch.sigmoid(self.update_gate(inputs))  # z, per interest and dimension
        return keep * state + (1.0 - keep) * update


class GRUCellGate(nn.Module):
    """M <- GRUCell(LN(M_hat), LN(M_prev)): the specification's gate read literally (a
    torch GRU cell whose input and hidden state are both layer-normalised)."""

    def __init__(self, D: int) -> None:
        super().__init__()
        self.ln_update = nn.LayerNorm(D)
        self.ln_state = nn.LayerNorm(D)
        self.gru = nn.GRUCell(D, D)

    def forward(self, update: Tensor, state: Tensor) -> Tensor:
        D = state.size(-1)
        gated = self.gru(self.ln_update(update).reshape(-1, D), self.ln_state(state).reshape(-1, D))
        return gated.view_as(state)


GATES: dict[Gate, Callable[[int], nn.Module]] = {"gru": InterestGate, "gru_cell": GRUCellGate}


# ------------------------------------------------------------------------------ model
@register_model
class RecRec(ScoringRecommender):
    config_class = RecRecConfig
    config: RecRecConfig
    s0: Tensor | None

    def __init__(self, config: RecRecConfig) -> None:
        super().__init__(config)
        D, R = config.hidden_size, config.num_interests
        self.spec = BACKBONES[config.backbone]
        self.backbone: SequentialRecommender = MODELS.get(config.backbone)(config.backbone_config())
        self.compressor = ContextCompressor(config)
        self.compressor.apply(self._init_weights)
        nn.init.trunc_normal_(self.compressor.queries, std=0.02, a=-0.04, b=0.04)
        self.reasoner = Reasoner(config) if config.stage == 2 else None
        self.gate = (
            GATES[config.gate](D) if config.stage == 2 and config.gate != "overwrite" else None
        )
        s0 = None
        if self.reasoner is not None:
            self.reasoner.apply(self._init_weights)
            if isinstance(self.gate, InterestGate):
                self.gate.apply(self._init_weights)  # z = 1/2 on average at first
            nn.init.zeros_(self.reasoner.attn.proj.weight)  # the Reasoner starts as the identity
            nn.init.zeros_(self.reasoner.ffn.w2.weight)
            # S_0: drawn once, identical for every user; a buffer (saved with the weights),
            # never a parameter: no gradient reaches it under deep supervision.
            s0 = nn.init.trunc_normal_(torch.empty(R, D), std=1.0, a=-2.0, b=2.0)
        self.register_buffer("s0", s0)
        for name, parameter in self.backbone.named_parameters():
            if name.startswith(self.spec.unused):
                parameter.requires_grad_(False)
        if config.stage == 2:  # frozen; excluded from the optimizer (requires_grad False)
            for parameter in (*self.backbone.parameters(), *self.compressor.parameters()):
                parameter.requires_grad_(False)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.xavier_normal_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    def train(self, mode: bool = True) -> RecRec:
        super().train(mode)
        if self.config.stage == 2:  # frozen; deterministic unless asked to keep its dropout
            self.backbone.train(mode and self.config.stage2_backbone_dropout)
        return self

    def items(self) -> Tensor:
        """(N + 1, D) the backbone's item embeddings e_v."""
        return cast(_ItemScorer, self.backbone).output_embedding()

    def encode(self, input_ids: Tensor, newest_only: bool, groups: Tensor | None = None) -> Encoded:
        """(B, L) histories -> H and M_0 of every group (the newest history of each row, or
        with a causal backbone every prefix); with ``groups``, a (B, G) mask, only of those,
        packed."""
        input_ids = input_ids[:, -self.config.max_seq_len :]
        hidden = self.spec.hidden(self.backbone, input_ids)
        mask = prefix_mask(input_ids != PAD_ID, newest_only)
        rows = None
        if groups is not None:
            rows, positions = groups.nonzero(as_tuple=True)  # row-major, as labels[groups]
            mask = mask[rows, positions].unsqueeze(1)
        reads = Reads.of(mask)
        return Encoded(hidden, reads, rows, self.compressor(hidden, reads, rows))

    def step(self, s: Tensor, m: Tensor, shared: KeysValues, reads: Reads) -> tuple[Tensor, Tensor]:
        """One reasoning step on (B, G, R, D) states (``shared``: H's keys for each of the B
        rows or packed groups): n scratchpad updates with M fixed, then the interests are
        updated from the scratchpad.

        Groups never read each other, so the step runs block by block of ``reads``: each
        block's activations stay in cache through the updates."""
        stepped = [
            self._step(s[:, groups], m[:, groups], shared, block) for groups, block in reads.split()
        ]
        return concat([s for s, _ in stepped], dim=1), concat([m for _, m in stepped], dim=1)

    def _step(
        self, s: Tensor, m: Tensor, shared: KeysValues, reads: Reads
    ) -> tuple[Tensor, Tensor]:
        reasoner = self.reasoner
        assert reasoner is not None
        fixed = reasoner.context(m)  # M is fixed during the scratchpad updates
        for _ in range(self.config.inner_steps):
            s = reasoner(s, fixed, shared, reads)  # S <- Reasoner(S, [H; M])
        update = reasoner(m, reasoner.context(s))  # M_hat = Reasoner(M, S)
        return s, update if self.gate is None else self.gate(update, m)

    def reason(self, encoded: Encoded, depth: int) -> Iterator[Tensor]:
        """M_1, ..., M_depth from M_0, starting the scratchpad at S_0."""
        if depth == 0:
            return
        assert self.reasoner is not None
        assert self.s0 is not None
        shared = select_rows(self.reasoner.context(encoded.hidden), encoded.rows)
        m = encoded.interests
        s = self.s0.expand_as(m)
        for _ in range(depth):
            s, m = self.step(s, m, shared, encoded.reads)
            yield m

    def interests(self, input_ids: Tensor, depth: int | None = None) -> Tensor:
        """(B, L) histories -> (B, R, D) interests after ``depth`` steps (default: the
        config's inference depth)."""
        encoded = self.encode(input_ids, newest_only=True)
        depth = self.config.inference_depth if depth is None else depth
        m = encoded.interests
        for deeper in self.reason(encoded, depth):
            m = deeper
        return m[:, 0]

    def interests_at_depths(self, input_ids: Tensor, max_depth: int) -> list[Tensor]:
        """(B, L) histories -> the (B, R, D) interests after 0, 1, ..., ``max_depth`` steps,
        in one pass (depth N + 1 continues from depth N)."""
        encoded = self.encode(input_ids, newest_only=True)
        deeper = self.reason(encoded, max_depth)
        return [m[:, 0] for m in (encoded.interests, *deeper)]

    def scores_at_depths(self, input_ids: Tensor, max_depth: int) -> Iterator[Tensor]:
        """``score`` at depths 0..max_depth from one encoding: max_depth + 1 (B, N + 1)
        tensors, each computed when the previous one has been consumed."""
        for m in self.interests_at_depths(input_ids, max_depth):
            yield self.interest_item_scores(m)

    def interest_item_scores(self, interests: Tensor) -> Tensor:
        """(B, R, D) interests -> (B, N + 1) log-mean-exp scores of every item."""
        return interest_scores(interests, self.items(), self.config.temperature)

    def score(self, input_ids: Tensor, users: Tensor | None = None) -> Tensor:
        return self.interest_item_scores(self.interests(input_ids))

    def objective(self, m: Tensor, targets: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """CE of the log-mean-exp scores + lambda IDR: (P, R, D), (P,) -> the loss () and
        its terms by name (empty without the IDR)."""
        next_item = interest_ce(m, self.items(), targets, self.config.temperature)
        if self.config.idr_weight == 0:
            return next_item, {}
        diversity = interest_diversity(m)
        loss = next_item + self.config.idr_weight * diversity
        return loss, {"next_item": next_item, "idr": diversity}

    def forward(self, batch: SeqBatch) -> ModelOutput:
        if self.config.stage == 1:
            encoded, real, targets = self._training_examples(batch)
            loss, terms = self.objective(encoded.examples(encoded.interests, real), targets)
            return ModelOutput(loss=loss, terms=terms, num_targets=targets.numel())
        rounds = list(self.supervision_rounds(batch))
        return ModelOutput(
            loss=torch.stack(rounds).mean(),
            terms={f"round_{k}": loss for k, loss in enumerate(rounds, start=1)},
            num_targets=self._num_examples(batch),
        )

    def training_updates(self, batch: SeqBatch) -> Iterator[ModelOutput]:
        if self.config.updates_per_batch == 1:
            yield from super().training_updates(batch)
            return
        examples = self._num_examples(batch)
        for k, loss in enumerate(self.supervision_rounds(batch), start=1):
            yield ModelOutput(loss=loss, terms={f"round_{k}": loss}, num_targets=examples)

    def _num_examples(self, batch: SeqBatch) -> int:
        """How many training examples the batch holds: its labelled positions, or with
        ``train_positions`` last or prefixes its rows with a newest label."""
        if batch.labels is None:
            return 0
        labels = batch.labels[:, -self.config.max_seq_len :]  # as _training_examples reads them
        if self.config.train_positions != "all":
            labels = labels[:, -1:]
        return int((labels != PAD_ID).sum())

    def _training_examples(self, batch: SeqBatch) -> tuple[Encoded, Tensor, Tensor]:
        """H and M_0 of the batch's training examples, which groups are real, their targets."""
        if batch.labels is None:
            raise ValueError("RecRec.forward needs batch.labels")
        # a prefix example's only label is in its last column
        newest_only = self.config.train_positions != "all"
        labels = batch.labels[:, -self.config.max_seq_len :]
        labels = labels[:, -1:] if newest_only else labels  # (B, G): one target per group
        real = labels != PAD_ID
        targets = labels[real]  # (P,), row-major, the order of packed groups
        pack = real if float(real.float().mean()) < PACK_BELOW else None
        with torch.no_grad() if self.config.stage == 2 else nullcontext():
            # stage 2: frozen; the compressor's dropout still draws in train mode
            encoded = self.encode(batch.input_ids, newest_only, groups=pack)
        return encoded, real, targets

    def supervision_rounds(self, batch: SeqBatch) -> Iterator[Tensor]:
        """Stage 2's deep supervision: K rounds of T steps from (S_0, M_0); only each round's
        last step has a gradient (1-step BPTT), S and M are detached between rounds. Yields
        each round's loss; with ``supervision_updates: round`` the optimizer steps between
        yields, and the next round reads the updated reasoner."""
        reasoner = self.reasoner
        assert reasoner is not None
        assert self.s0 is not None
        encoded, real, targets = self._training_examples(batch)
        reads, m = encoded.reads, encoded.interests
        s = self.s0.expand_as(m)
        stepping = self.config.updates_per_batch > 1
        shared = None
        for _ in range(self.config.rounds):
            if shared is None or stepping:  # read again after each optimizer step
                # H's keys depend on the reasoner: they keep their gradient
                shared = select_rows(reasoner.context(encoded.hidden), encoded.rows)
            with torch.no_grad():
                for _ in range(self.config.steps_per_round - 1):
                    s, m = self.step(s, m, shared, reads)
            s, m = self.step(s, m, shared, reads)
            yield self.objective(encoded.examples(m, real), targets)[0]
            s, m = s.detach(), m.detach()
