"""BERT4Rec: Sequential Recommendation with Bidirectional Encoder Representations from
Transformer (Sun et al., CIKM 2019).

Paper: https://arxiv.org/abs/1904.06690 - reference code: github.com/FeiSun/BERT4Rec
(TensorFlow, built on Google's BERT). PyTorch reproductions: asash/bert4rec_repro (Petrov &
Macdonald, RecSys 2022) and antklen/sasrec-bert4rec-recsys23 (Klenitskiy & Vasilev,
RecSys 2023).

A bidirectional post-LN Transformer over the item sequence (padding masked, no causal mask),
trained with the Cloze task: some items of a sequence are replaced by a [MASK] token (id
N + 1) and predicted from both sides. At inference a [MASK] is appended after the history
and its output scores the next item through the paper's output layer, GELU(h W^P + b^P)
(followed by a LayerNorm in the reference code), then a dot product with the shared item
embedding plus a per-item bias.

Differences from the reference implementation, all deliberate:
- Each epoch gives one training row per user (the most recent max_seq_len items), masked
  afresh with the torch RNG. The reference writes one fixed file instead: every sliding
  window of max_seq_len items (step 0.5 * max_seq_len on ML-1M, 0.1 * on Beauty) in 10
  randomly masked copies (dupe_factor) plus one copy with only its last item masked. Older
  windows of histories longer than max_seq_len are not trained on here (as in Klenitskiy &
  Vasilev).
- The last-item-only copies become a per-row probability, ``last_item_mask_prob``,
  defaulting to the reference's share of them, 1 / 11.
- As in the reference, a row masks exactly max(1, round(n * mask_prob)) of its n items,
  so every row has a target (its max_predictions_per_seq cap never binds at the paper's
  settings), and chosen items always become [MASK] (its run scripts' ``mask_prob=1.0``;
  BERT's 80/10/10 rule is ``mask_token_prob: 0.8``).
- The softmax runs over items 1..N. The reference's runs over its whole vocabulary, with
  the [PAD], [MASK] and [NO_USE] tokens that are never targets.
- Left padding with positions counted from the right, so the newest item and the
  inference [MASK] always have position max_seq_len - 1. The reference pads on the right
  and counts from the left, so its inference [MASK] sits at position len(history).
- No token-type embedding: the reference adds BERT's segment embedding of type 0 to every
  position, one learned constant vector before the embedding LayerNorm.
- The reference trains on the validation item too (it has no validation split); here it
  is held out for early stopping, as for every model of the library.
- Optimisation (the paper's Adam with weight decay 0.01, linear decay, lr 1e-4, 400,000
  steps of 256) is the trainer's business; the configs say what they use.
- Besides the paper's full softmax cross-entropy (``loss: ce``), any sampled loss of the
  menu scores the masked positions, output bias included.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqrec.batch import PAD_ID, ModelOutput, SeqBatch
from seqrec.config import ConfigError, check_float
from seqrec.models.base import ScoringRecommender, register_model
from seqrec.models.objective import ItemLossConfig, LossName, dot_product_loss
from seqrec.nn.attention import attention
from seqrec.nn.dropout import Dropout
from seqrec.nn.masks import padding_bias


@dataclass(frozen=True, kw_only=True)
class BERT4RecConfig(ItemLossConfig):
    name: ClassVar[str] = "bert4rec"
    targets_from_labels: ClassVar[bool] = False  # its cloze masks the inputs
    objective_fields: ClassVar[tuple[str, ...]] = (
        *ItemLossConfig.objective_fields,
        "mask_prob",
        "mask_token_prob",
        "last_item_mask_prob",
    )
    max_seq_len: int = 200  # N: 200 on ML-1M, 50 on Beauty (paper); [MASK] included
    hidden_size: int = 64  # d (paper: 2 heads of 32)
    num_layers: int = 2
    num_heads: int = 2
    ffn_size: int | None = None  # inner width of the GELU FFN; None = 4 * hidden_size (paper)
    # On the embeddings and each sublayer's output: 0.1 in the paper; the authors' JSON
    # configs say 0.2 on ML-1M and 0.5 on Beauty (with 0.2 on the attention weights).
    dropout: float = 0.1
    attention_dropout: float | None = None  # on the attention weights; None = dropout
    mask_prob: float = 0.2  # rho, share of a row's items masked: 0.2 ML-1M, 0.6 Beauty (paper)
    mask_token_prob: float = 1.0  # masked items shown as [MASK]; the rest half kept, half random
    last_item_mask_prob: float = 1 / 11  # rows that mask only their newest item
    loss: LossName = "ce"  # the paper's softmax over all items; any of the loss menu

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_heads < 1 or self.hidden_size % self.num_heads != 0:
            raise ConfigError(
                f"model.hidden_size {self.hidden_size} must be divisible by "
                f"model.num_heads {self.num_heads} (>= 1)"
            )
        if self.num_layers < 0:
            raise ConfigError(f"model.num_layers must be >= 0, got {self.num_layers}")
        if self.max_seq_len < 2:
            raise ConfigError(
                f"model.max_seq_len must be >= 2 (history + [MASK]), got {self.max_seq_len}"
            )
        check_float("model.dropout", self.dropout, at_least=0.0, below=1.0)
        check_float(
            "model.attention_dropout",
            self.attention_dropout,
            at_least=0.0,
            below=1.0,
            nullable=True,
        )
        check_float("model.mask_prob", self.mask_prob, above=0.0, at_most=1.0)
        check_float("model.mask_token_prob", self.mask_token_prob, at_least=0.0, at_most=1.0)
        check_float(
            "model.last_item_mask_prob", self.last_item_mask_prob, at_least=0.0, at_most=1.0
        )

    @property
    def mask_id(self) -> int:
        """The [MASK] token: one id past the catalogue."""
        return self.num_items + 1


class SelfAttention(nn.Module):
    """Multi-head bidirectional self-attention; only padded keys are masked."""

    def __init__(self, config: BERT4RecConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        attention_dropout = config.attention_dropout
        self.dropout = config.dropout if attention_dropout is None else attention_dropout
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: Tensor, mask: Tensor, last_only: bool = False) -> Tensor:
        """(B, L, D) -> (B, L, D), or (B, 1, D) for the newest position with ``last_only``."""
        B, _, D = x.shape
        if last_only:  # inference: keys and values for all positions, one query
            k, v = torch.split(F.linear(x, self.qkv.weight[D:], self.qkv.bias[D:]), D, dim=-1)
            q = F.linear(x[:, -1:], self.qkv.weight[:D], self.qkv.bias[:D])
            mask = mask[:, :, -1:]
        else:
            q, k, v = self.qkv(x).split(D, dim=-1)
        # (B, L, D) -> (B, H, L, D / H)
        H = self.num_heads
        q, k, v = (t.view(B, -1, H, D // H).transpose(1, 2) for t in (q, k, v))
        y = attention(q, k, v, mask, self.dropout, self.training)
        return self.proj(y.transpose(1, 2).reshape(B, -1, D))


class Block(nn.Module):
    """Post-LN Transformer layer (BERT): x = LN(x + Drop(Attn(x))); LN(x + Drop(FFN(x))).

    Same as sasrec.Block except: no causal mask, LayerNorm after the residual, GELU FFN.
    """

    def __init__(self, config: BERT4RecConfig) -> None:
        super().__init__()
        D = config.hidden_size
        inner = config.ffn_size or 4 * D
        self.attn = SelfAttention(config)
        self.ln_attn = nn.LayerNorm(D, eps=1e-12)  # BERT's epsilon
        self.ffn = nn.Sequential(nn.Linear(D, inner), nn.GELU(), nn.Linear(inner, D))
        self.ln_ffn = nn.LayerNorm(D, eps=1e-12)
        self.dropout = Dropout(config.dropout)

    def forward(self, x: Tensor, mask: Tensor, last_only: bool = False) -> Tensor:
        attended = self.dropout(self.attn(x, mask, last_only))
        if last_only:
            x = x[:, -1:]
        x = self.ln_attn(x + attended)
        return self.ln_ffn(x + self.dropout(self.ffn(x)))


def cloze_mask(real: Tensor, mask_prob: float, last_item_mask_prob: float) -> Tensor:
    """(B, L) real-item mask, left-padded -> (B, L) bool, True = predict this item.

    A row masks max(1, round(n * mask_prob)) of its n items, chosen uniformly (the
    reference's count, Python 2 rounding: halves up); with probability
    ``last_item_mask_prob`` it masks only its newest item instead.
    """
    B, L = real.shape
    counts = real.sum(dim=1, keepdim=True)  # (B, 1)
    k = torch.floor(counts * mask_prob + 0.5).clamp(min=1)
    # A uniformly random order of each row's items: rank of a random key among real items.
    keys = torch.rand(B, L, device=real.device).masked_fill(~real, 2.0)
    ranks = keys.argsort(dim=1).argsort(dim=1)
    chosen = (ranks < k) & real
    last_only = torch.rand(B, 1, device=real.device) < last_item_mask_prob
    newest = torch.zeros_like(real)
    newest[:, -1] = True
    return torch.where(last_only, newest & real, chosen)


@register_model
class BERT4Rec(ScoringRecommender):
    config_class = BERT4RecConfig
    config: BERT4RecConfig

    def __init__(self, config: BERT4RecConfig) -> None:
        super().__init__(config)
        D = config.hidden_size
        # Rows: PAD_ID, items 1..N, [MASK] = N + 1.
        self.item_emb = nn.Embedding(config.num_items + 2, D, padding_idx=PAD_ID)
        self.pos_emb = nn.Embedding(config.max_seq_len, D)
        self.ln_emb = nn.LayerNorm(D, eps=1e-12)
        self.emb_dropout = Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        # Output transform (reference: cls/predictions/transform), then the shared item
        # embedding and an output-only bias per item.
        self.head = nn.Sequential(nn.Linear(D, D), nn.GELU(), nn.LayerNorm(D, eps=1e-12))
        self.out_bias = nn.Parameter(torch.zeros(config.num_items + 1))
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # BERT: truncated normal, std 0.02 (cut at 2 std) for every matrix, zero biases;
        # LayerNorm keeps ones/zeros; the padding row stays zero.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.trunc_normal_(module.weight, std=0.02, a=-0.04, b=0.04)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()

    def output_embedding(self) -> Tensor:
        """(N + 1, D) the item rows of the shared embedding ([MASK] excluded)."""
        return self.item_emb.weight[: self.config.num_items + 1]

    def encode(self, input_ids: Tensor, last_only: bool = False) -> Tensor:
        """(B, L) left-padded ids (items or [MASK]) -> (B, L, D) hidden states.

        ``last_only`` returns (B, 1, D) for the newest position and skips the last block's
        work for the other positions (what scoring needs).
        """
        input_ids = input_ids[:, -self.config.max_seq_len :]
        L = input_ids.size(1)
        # Right-aligned positions: the newest item is always max_seq_len - 1.
        positions = torch.arange(
            self.config.max_seq_len - L, self.config.max_seq_len, device=input_ids.device
        )
        x = self.emb_dropout(self.ln_emb(self.item_emb(input_ids) + self.pos_emb(positions)))
        real = input_ids != PAD_ID
        mask = padding_bias(real, causal=False, dtype=x.dtype)  # (B, 1, L, L)
        for index, block in enumerate(self.blocks):
            x = block(x, mask, last_only and index == len(self.blocks) - 1)
        return x[:, -1:] if last_only else x

    def logits(self, hidden: Tensor) -> Tensor:
        """(..., D) encoder outputs -> (..., N + 1) item scores; column PAD_ID is meaningless."""
        return self.head(hidden) @ self.output_embedding().T + self.out_bias

    def cloze(self, batch: SeqBatch) -> tuple[Tensor, Tensor, Tensor | None]:
        """A training batch -> masked input ids (B, L), cloze labels (B, L) (PAD_ID = no
        loss), and per-position negatives aligned with them when the batch has them.

        The row is rebuilt as input_ids + the last label (input = row[:-1], labels =
        row[1:], so every non-empty row ends in a real label), then cut to its newest
        max_seq_len items. Masks come from the torch RNG, which the trainer seeds per epoch.
        """
        if batch.labels is None:
            raise ValueError("BERT4Rec.forward needs batch.labels")
        width = self.config.max_seq_len
        # (B, L) + (B, 1) -> (B, min(L + 1, max_seq_len)), still left-padded
        full = torch.cat([batch.input_ids, batch.labels[:, -1:]], dim=1)[:, -width:]
        real = full != PAD_ID
        chosen = cloze_mask(real, self.config.mask_prob, self.config.last_item_mask_prob)
        labels = torch.where(chosen, full, PAD_ID)  # predict exactly the chosen items
        shown = torch.full_like(full, self.config.mask_id)  # what a chosen item is replaced by
        if self.config.mask_token_prob < 1.0:  # BERT's rule: some kept, some random items
            u = torch.rand(full.shape, device=full.device)
            keep = u >= self.config.mask_token_prob
            random = u >= (1.0 + self.config.mask_token_prob) / 2
            noise = torch.randint_like(full, 1, self.config.num_items + 1)
            shown = torch.where(random, noise, torch.where(keep, full, shown))
        masked = torch.where(chosen, shown, full)
        negatives = batch.negatives
        if negatives is not None and negatives.dim() == 3:
            # (B, L, S) drawn per next-item position; position j of the rebuilt row reuses
            # the row's draws at j, and the appended last item those of the position before.
            negatives = torch.cat([negatives, negatives[:, -1:]], dim=1)[:, -width:]
        return masked, labels, negatives

    def forward(self, batch: SeqBatch) -> ModelOutput:
        masked, labels, negatives = self.cloze(batch)
        hidden = self.encode(masked)  # (B, L, D)
        # The output transform runs before the loss, which adds the bias as an extra column.
        cloze_batch = dataclasses.replace(
            batch, input_ids=masked, labels=labels, negatives=negatives
        )
        loss = dot_product_loss(
            self.config,
            self.head(hidden),
            labels,
            cloze_batch,
            self.output_embedding(),
            bias=self.out_bias,
        )
        return ModelOutput(loss=loss, hidden=hidden, num_targets=int((labels != PAD_ID).sum()))

    def with_mask_appended(self, input_ids: Tensor) -> Tensor:
        """(B, L) histories -> (B, min(L + 1, max_seq_len)) with [MASK] as the newest item."""
        mask = input_ids.new_full((input_ids.size(0), 1), self.config.mask_id)
        return torch.cat([input_ids, mask], dim=1)[:, -self.config.max_seq_len :]

    def score(self, input_ids: Tensor, users: Tensor | None = None) -> Tensor:
        hidden = self.encode(self.with_mask_appended(input_ids), last_only=True)
        return self.logits(hidden[:, -1])  # (B, N + 1): the appended [MASK]'s prediction
