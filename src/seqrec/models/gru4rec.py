"""GRU4Rec and GRU4Rec+: a GRU over the history, its state scores the next item.

Papers: Hidasi et al., "Session-based Recommendations with Recurrent Neural Networks"
(ICLR 2016, https://arxiv.org/abs/1511.06939); Hidasi & Karatzoglou, "Recurrent Neural
Networks with Top-k Gains for Session-based Recommendations" (CIKM 2018,
https://arxiv.org/abs/1706.03847) - GRU4Rec+: BPR-max / TOP1-max with additional negatives
sampled in proportion to popularity^alpha and shared by the mini-batch.
Reference code: github.com/hidasib/GRU4Rec (Theano; the SASRec paper ran the authors' code)
and github.com/hidasib/GRU4Rec_PyTorch_Official.

The state h_t after item s_t scores item j as r_j = <h_t, W_j> + b_j (W, b: the output item
matrix and bias; ``shared_embedding`` makes W the input embedding too, the authors'
"constrained embedding"). Any loss of the menu applies (seqrec.models.objective): the
original pairwise losses with in-batch negatives, GRU4Rec+'s ``bpr_max`` / ``top1_max`` with
popularity-sampled shared negatives, or ``ce`` (the full softmax the authors now recommend).

Differences from the reference implementation, all deliberate:
- Sequence-parallel training: each row is one user's history (its last ``max_seq_len``
  items) and the loss is taken at every position, with backpropagation through the whole
  row. The reference trains session-parallel mini-batches (row b holds one session at a
  time, a finished session is replaced by the next one) and backpropagates one step only.
- The input is an item embedding of width ``embedding_size`` (default ``hidden_size``) fed
  to torch.nn.GRU, where the original multiplies the one-hot input straight into the gates
  (an N x 3H input matrix). ``shared_embedding`` is the reference's constrained embedding:
  the output matrix W is also the input embedding.
- Hidden-state dropout (``dropout``) drops the GRU's output, i.e. what scores items and
  feeds the next layer; the reference also carries the dropped-out state into the next time
  step, which torch.nn.GRU (and cuDNN) cannot do.
- Negatives come from one sampler: GRU4Rec+'s additional 2048 popularity^alpha samples are
  ``negative_sampler: popularity, shared_negatives: true`` (one set per row, excluding the
  user's items), without the mini-batch's other targets that the reference adds to them.
  Plain TOP1 is not in the loss menu; the original GRU4Rec configs use BPR, the paper's
  other pairwise loss, with in-batch negatives.
- In-batch negatives are one set of ``num_negatives`` (50) drawn, with replacement, from the
  targets of the whole batch and shared by every position of every row; the reference's are
  the other targets of the same time step of its 50 session-parallel rows. A batch of
  sequence-parallel rows has about a hundred times more positions than such a step, so each
  position here meets far fewer distinct negatives per epoch.
- Scores are linear (``elu_param`` > 0: ELU); the original TOP1 runs put a tanh on them
  (``final_act='tanh'``), which the BPR configs here have no use for.
- Optimiser and batch are the experiment's (Adam; the reference uses Adagrad with momentum).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqrec.batch import PAD_ID, ModelOutput, NegativeSampler, SeqBatch
from seqrec.config import ConfigError, check_float
from seqrec.models.base import ScoringRecommender, register_model
from seqrec.models.objective import (
    ItemLossConfig,
    LossName,
    Positions,
    batch_negatives,
    dot_product_loss,
    in_batch_negatives,
    sampled_item_loss,
)
from seqrec.nn.dropout import Dropout


@dataclass(frozen=True, kw_only=True)
class GRU4RecConfig(ItemLossConfig):
    name: ClassVar[str] = "gru4rec"
    at_least_one: ClassVar[tuple[str, ...]] = ("num_layers",)
    hidden_size: int = 100  # GRU units; 100 in both papers
    num_layers: int = 1
    embedding_size: int | None = None  # input item embedding width; None = hidden_size
    shared_embedding: bool = False  # the input embedding is the output matrix ("constrained")
    item_bias: bool = True  # b_j in r_j = <h, W_j> + b_j, as the reference's By
    dropout: float = 0.5  # on the GRU's output (the reference's dropout_p_hidden default)
    embedding_dropout: float = 0.0  # on the input embeddings (dropout_p_embed)
    # > 0: sampled losses see ELU(r, elu_param) instead of r, as the reference's BPR-max
    # (elu-0.5 in the GRU4Rec+ settings). Monotone, so rankings are unchanged.
    elu_param: float = 0.0
    # The original GRU4Rec: a pairwise loss against the other targets of the mini-batch
    # (the reference code's default batch of 50 gives 49 such negatives).
    loss: LossName = "bpr"
    negative_sampler: NegativeSampler = "in_batch"
    num_negatives: int = 50

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.shared_embedding and self.embedding_size not in (None, self.hidden_size):
            raise ConfigError(
                f"model.shared_embedding needs embedding_size == hidden_size "
                f"({self.hidden_size}) or null, got {self.embedding_size}"
            )
        check_float("model.dropout", self.dropout, at_least=0.0, below=1.0)
        check_float("model.embedding_dropout", self.embedding_dropout, at_least=0.0, below=1.0)
        check_float("model.elu_param", self.elu_param, at_least=0.0)
        if self.elu_param > 0.0 and self.loss == "ce":
            raise ConfigError("model.elu_param applies to sampled losses; use 0 with loss: ce")


def _uniform_init(weight: Tensor, fan_in: int, fan_out: int) -> None:
    """U(-s, s) with s = sqrt(6 / (fan_in + fan_out)), the reference's init_matrix."""
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    nn.init.uniform_(weight, -bound, bound)


@register_model
class GRU4Rec(ScoringRecommender):
    config_class = GRU4RecConfig
    config: GRU4RecConfig

    def __init__(self, config: GRU4RecConfig) -> None:
        super().__init__(config)
        H, N = config.hidden_size, config.num_items
        E = config.embedding_size or H
        self.item_emb = nn.Embedding(N + 1, E, padding_idx=PAD_ID)
        self.out_emb = None if config.shared_embedding else nn.Embedding(N + 1, H)
        self.item_bias = nn.Parameter(torch.zeros(N + 1)) if config.item_bias else None
        self.emb_dropout = Dropout(config.embedding_dropout)
        # nn.GRU drops between layers; the last layer's output is dropped in encode.
        between = config.dropout if config.num_layers > 1 else 0.0
        self.gru = nn.GRU(E, H, num_layers=config.num_layers, batch_first=True, dropout=between)
        self.dropout = Dropout(config.dropout)
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self) -> None:
        # The reference: every matrix U(+-sqrt(6 / (rows + cols))), per gate for the GRU;
        # biases zero. The padding row stays zero.
        N, H = self.config.num_items, self.config.hidden_size
        _uniform_init(self.item_emb.weight, N, self.item_emb.embedding_dim)
        self.item_emb.weight[PAD_ID].zero_()
        if self.out_emb is not None:
            _uniform_init(self.out_emb.weight, N, H)
        for name, param in self.gru.named_parameters():
            if name.startswith("bias"):
                nn.init.zeros_(param)
                continue
            for gate in param.chunk(3, dim=0):  # (H, fan_in) per gate: reset, update, new
                _uniform_init(gate, gate.size(1), H)

    def output_embedding(self) -> Tensor:
        """(N + 1, H) W: the matrix that scores items."""
        return (self.out_emb or self.item_emb).weight

    def encode(self, input_ids: Tensor) -> Tensor:
        """(B, L) left-padded item ids -> (B, L, H) the state after each item, zero at
        padding; the newest item's state is at index -1.

        Left padding must not reach the GRU (its biases would move the state away from
        zero), so each row is shifted to start at column 0: the GRU reads the real items
        first, from the zero state, and its outputs are shifted back. The trailing padding
        it then reads cannot reach earlier outputs (the GRU is causal). This is ~9x faster
        on CPU than a PackedSequence, whose backward pass is quadratic in L there.
        """
        input_ids = input_ids[:, -self.config.max_seq_len :]
        L = input_ids.size(1)
        real = input_ids != PAD_ID  # (B, L)
        x, shift = self._real_items_first(input_ids, real.sum(dim=1))
        out, _ = self.gru(x)  # (B, L, H), row b's real states in columns 0..len_b - 1
        steps = torch.arange(L, device=input_ids.device)
        to_left = ((steps - shift) % L).unsqueeze(-1).expand(-1, -1, out.size(-1))
        hidden = out.gather(1, to_left) * real.unsqueeze(-1)  # back to left padding
        return self.dropout(hidden)

    def _real_items_first(self, input_ids: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """(B, L) left-padded ids and (B,) real lengths -> the (B, L, E) input embeddings
        with each row's real items moved to columns 0..len - 1, and (B, 1) the shift."""
        L = input_ids.size(1)
        shift = (L - lengths).unsqueeze(1)  # (B, 1) padding columns of each row
        to_right = (torch.arange(L, device=input_ids.device) + shift) % L  # t-th real item
        return self.emb_dropout(self.item_emb(input_ids.gather(1, to_right))), shift

    def forward(self, batch: SeqBatch) -> ModelOutput:
        if batch.labels is None:
            raise ValueError("GRU4Rec.forward needs batch.labels")
        hidden = self.encode(batch.input_ids)  # (B, L, H)
        labels = batch.labels[:, -hidden.size(1) :]
        if self.config.elu_param > 0.0:
            loss = self._elu_loss(hidden, labels, batch)
        else:
            loss = dot_product_loss(
                self.config, hidden, labels, batch, self.output_embedding(), self.item_bias
            )
        return ModelOutput(loss=loss, hidden=hidden)

    def _elu_loss(self, hidden: Tensor, labels: Tensor, batch: SeqBatch) -> Tensor:
        """The configured sampled loss of ELU(<h, W_j> + b_j).

        Same as objective.dot_product_loss (one product per row for (B, S) negatives, one
        (P, H) x (H, S) product for in-batch ones) except for the ELU on every score.
        """
        config = self.config
        items = self.output_embedding()
        bias = self.item_bias if self.item_bias is not None else items.new_zeros(items.size(0))
        positions = Positions.of(labels)
        h = positions.select(hidden)  # (P, H)
        targets = positions.targets
        pos = (h * items[targets]).sum(-1) + bias[targets]  # (P,)
        if config.negative_sampler == "in_batch":
            shared = in_batch_negatives(config, targets)  # (S,)
            neg = torch.addmm(bias[shared].unsqueeze(0), h, items[shared].T)  # (P, S)
            negatives = shared.unsqueeze(0).expand_as(neg)
        elif batch.negatives is not None and batch.negatives.dim() == 2:  # (B, S) per row
            per_row = batch.negatives.long()
            per_row_bias = bias[per_row].unsqueeze(1)  # (B, 1, S)
            neg = positions.select(
                torch.baddbmm(per_row_bias, hidden, items[per_row].transpose(1, 2))
            )  # (B, L, S) -> (P, S)
            negatives = per_row.index_select(0, positions.rows)
        else:  # (B, L, S) per position
            negatives = batch_negatives(config, batch, positions)
            neg = torch.einsum("ph,psh->ps", h, items[negatives]) + bias[negatives]
        pos, neg = F.elu(pos, config.elu_param), F.elu(neg, config.elu_param)
        return sampled_item_loss(config, pos, neg, targets, negatives, batch.log_q)

    def score(self, input_ids: Tensor, users: Tensor | None = None) -> Tensor:
        last = self.encode(input_ids)[:, -1]  # (B, H): left padding puts the newest last
        return self._scores(last)

    def _scores(self, state: Tensor) -> Tensor:
        """(B, H) top-layer states -> (B, N + 1) item scores."""
        scores = state @ self.output_embedding().T
        return scores if self.item_bias is None else scores + self.item_bias

    @torch.no_grad()
    def init_state(self, input_ids: Tensor) -> tuple[Tensor, Tensor]:
        """Encode whole (B, L) left-padded histories, each with at least one item: the GRU
        state after the newest item, (num_layers, B, H), and (B, N + 1) scores.

        No truncation to max_seq_len: the state is that of the full history, which is what
        ``step`` extends. ``score`` equals it in eval mode for histories up to max_seq_len
        items; for longer ones ``score`` sees only the most recent max_seq_len.
        """
        lengths = (input_ids != PAD_ID).sum(dim=1)
        if not bool((lengths > 0).all()):
            raise ValueError("init_state needs at least one real item per history")
        x, _ = self._real_items_first(input_ids, lengths)
        packed = nn.utils.rnn.pack_padded_sequence(
            x, lengths.cpu(), batch_first=True, enforce_sorted=False
        )
        _, state = self.gru(packed)  # every layer's state after each row's newest item
        return state, self._scores(self.dropout(state[-1]))

    @property
    def state_horizon(self) -> int | None:
        """None: a GRU's state extends to any length."""
        return None

    @torch.no_grad()
    def step(self, state: Tensor, item_ids: Tensor) -> tuple[Tensor, Tensor]:
        """Append one item per user, (B,) real ids -> the new state and (B, N + 1) scores;
        O(1) in the history length, equal to ``init_state`` on the extended histories."""
        if bool((item_ids == PAD_ID).any()):
            raise ValueError("step needs a real item for every user, not PAD_ID")
        x = self.emb_dropout(self.item_emb(item_ids)).unsqueeze(1)  # (B, 1, E)
        out, state = self.gru(x, state)
        return state, self._scores(self.dropout(out[:, 0]))
