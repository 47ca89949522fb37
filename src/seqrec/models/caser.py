"""Caser: convolutional sequence embedding (Tang & Wang, WSDM 2018).

Paper: "Personalized Top-N Sequential Recommendation via Convolutional Sequence Embedding",
https://arxiv.org/abs/1809.07426 - reference code: github.com/graytowne/caser_pytorch.

The embedding matrix of the last L items, E (L x d), goes through
- horizontal convolutions: n_h filters of each height h = 1..L spanning the full width d,
  an activation, then a max over time (union-level and point-level sequential patterns);
- a vertical convolution: n_v filters of size L x 1, i.e. n_v learned weighted sums of the
  L rows (no activation, as in the reference code).
Their concatenation is dropped out and projected to z = phi(W1 [o_v; o_h] + b1) in R^d;
the user embedding P_u is appended and item j scores r_j = <[z; P_u], W'_j> + b'_j with a
second item matrix W' (2d wide) and bias b'. The paper's component ablation (without P_u,
horizontal or vertical convolutions only) is config: ``user_embedding``, ``num_vertical: 0``,
``num_horizontal: 0``. The convolutions keep the reference's Conv2d parameters but run as
matrix products (tests check them against Conv2d).

Differences from the reference implementation, all deliberate:
- Every position of a history is trained, each on the window of the L items ending there
  (left-padded with the zero padding embedding), built with ``unfold``; the reference makes
  one training instance per full window of L + T items (and a single padded one for users
  with fewer). The padding item's embedding is fixed at zero; the reference learns one.
- The T targets ahead (``targets_ahead``, the paper's "skip" behaviour) of position t are
  the labels at t, t + 1, ..., t + T - 1, each with the negatives sampled for its own
  position; the reference draws 3 negatives per target and shares them among the T.
- Besides the paper's BCE (here summed over a position's negatives, as SASRec's; the
  reference averages them), the whole loss menu applies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar, Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqrec.batch import PAD_ID, ModelOutput, SeqBatch
from seqrec.config import ConfigError, check_float
from seqrec.models.base import ScoringRecommender, register_model
from seqrec.models.objective import ItemLossConfig, LossName, dot_product_loss
from seqrec.nn.dropout import Dropout

Activation = Literal["relu", "tanh", "sigmoid", "identity"]
ACTIVATIONS: dict[Activation, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "identity": lambda x: x,
}


@dataclass(frozen=True, kw_only=True)
class CaserConfig(ItemLossConfig):
    name: ClassVar[str] = "caser"
    at_least_one: ClassVar[tuple[str, ...]] = ("window", "targets_ahead")
    hidden_size: int = 50  # d
    window: int = 5  # L: how many of the most recent items the convolutions read
    num_horizontal: int = 16  # n_h filters per height 1..L (0: no horizontal convolutions)
    num_vertical: int = 4  # n_v (0: no vertical convolution)
    dropout: float = 0.5  # on the concatenated convolution outputs
    conv_activation: Activation = "relu"  # phi_c after the horizontal convolutions
    fc_activation: Activation = "relu"  # phi_a after the fully-connected layer
    user_embedding: bool = True  # P_u; False is the paper's non-personalised ablation
    targets_ahead: int = 3  # T: each position is trained on its next T items
    # The paper's BCE with 3 negatives per target.
    loss: LossName = "bce"
    num_negatives: int = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_horizontal + self.num_vertical == 0:
            raise ConfigError("model.num_horizontal and model.num_vertical cannot both be 0")
        check_float("model.dropout", self.dropout, at_least=0.0, below=1.0)
        if self.user_embedding and self.num_users < 1:
            raise ConfigError("model.user_embedding needs the number of users from the data")


@register_model
class Caser(ScoringRecommender):
    config_class = CaserConfig
    config: CaserConfig

    def __init__(self, config: CaserConfig) -> None:
        super().__init__(config)
        D, L, N = config.hidden_size, config.window, config.num_items
        self.item_emb = nn.Embedding(N + 1, D, padding_idx=PAD_ID)
        self.user_emb = nn.Embedding(config.num_users, D) if config.user_embedding else None
        # Conv2d parameters over the (1, L, D) "image" as in the reference (weights can be
        # copied); encode applies them as matrix products.
        self.conv_v = nn.Conv2d(1, config.num_vertical, (L, 1)) if config.num_vertical else None
        self.conv_h = nn.ModuleList(
            nn.Conv2d(1, config.num_horizontal, (h, D))
            for h in range(1, L + 1)
            if config.num_horizontal
        )
        self.conv_activation = ACTIVATIONS[config.conv_activation]
        self.fc_activation = ACTIVATIONS[config.fc_activation]
        self.dropout = Dropout(config.dropout)
        self.fc = nn.Linear(config.num_vertical * D + config.num_horizontal * L, D)
        out = 2 * D if config.user_embedding else D
        self.out_emb = nn.Embedding(N + 1, out)  # W'
        self.out_bias = nn.Parameter(torch.zeros(N + 1))  # b'
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self) -> None:
        # The reference: N(0, 1/width) for the embeddings, zero output bias, PyTorch's
        # defaults for the convolutions and the FC layer.
        for emb in (self.item_emb, self.user_emb, self.out_emb):
            if emb is not None:
                emb.weight.normal_(0.0, 1.0 / emb.embedding_dim)
        self.item_emb.weight[PAD_ID].zero_()

    @property
    def uses_users(self) -> bool:
        return self.config.user_embedding

    def windows(self, input_ids: Tensor) -> Tensor:
        """(B, L') left-padded ids -> (B, L', L) the window of the L items ending at each
        position (PAD_ID before the history starts)."""
        padded = F.pad(input_ids, (self.config.window - 1, 0), value=PAD_ID)
        return padded.unfold(1, self.config.window, 1)

    def encode(self, windows: Tensor) -> Tensor:
        """(M, L) item windows -> (M, D) z = phi_a(W1 [o_v; o_h] + b1)."""
        x = self.item_emb(windows)  # (M, L, D)
        parts = []
        if self.conv_v is not None:  # o_v[f] = sum_l w_f[l] E_l + b_f: (M, n_v * D)
            weight, bias = self.conv_v.weight[:, 0, :, 0], self.conv_v.bias  # (n_v, L), (n_v,)
            assert bias is not None
            parts.append((torch.einsum("mld,fl->mfd", x, weight) + bias[:, None]).flatten(1))
        for conv in self.conv_h:
            parts.append(self._horizontal(x, cast(nn.Conv2d, conv)))  # (M, n_h)
        o = self.dropout(torch.cat(parts, dim=1))
        return self.fc_activation(self.fc(o))

    def _horizontal(self, x: Tensor, conv: nn.Conv2d) -> Tensor:
        """(M, L, D) -> (M, n_h): the h x D convolution ``conv`` at every start i, activated
        and max-pooled over i.

        Computed as one product of the unfolded h-row windows with the flattened filters;
        Conv2d itself gives the same numbers, about 2.5x slower on CPU (its backward).
        """
        M, L, D = x.shape
        n, _, h, _ = conv.weight.shape
        windows = x.unfold(1, h, 1).reshape(-1, D * h)  # (M * (L - h + 1), D * h), (D, h) order
        filters = conv.weight[:, 0].transpose(1, 2).reshape(n, D * h)  # (n_h, D * h) alike
        assert conv.bias is not None
        out = torch.addmm(conv.bias, windows, filters.T).view(M, L - h + 1, n)
        return self.conv_activation(out).amax(dim=1)

    def _with_user(self, z: Tensor, users: Tensor | None) -> Tensor:
        """(B, ..., D) -> (B, ..., 2D) [z; P_u], or z itself without a user embedding."""
        if self.user_emb is None:
            return z
        if users is None:
            raise ValueError("Caser has a user embedding: pass the user indices")
        user = self.user_emb(users)  # (B, D)
        user = user.view(user.size(0), *([1] * (z.dim() - 2)), -1).expand_as(z)
        return torch.cat([z, user], dim=-1)

    def forward(self, batch: SeqBatch) -> ModelOutput:
        if batch.labels is None:
            raise ValueError("Caser.forward needs batch.labels")
        input_ids = batch.input_ids[:, -self.config.max_seq_len :]
        B, L = input_ids.shape
        z = self.encode(self.windows(input_ids).reshape(B * L, -1)).view(B, L, -1)
        hidden = self._with_user(z, batch.users)  # (B, L, 2D)
        labels = batch.labels[:, -L:]
        ahead, ahead_labels = self._targets_ahead(batch, labels, input_ids != PAD_ID)
        T = self.config.targets_ahead
        loss = dot_product_loss(
            self.config,
            hidden.repeat(T, 1, 1),
            ahead_labels,
            ahead,
            self.out_emb.weight,
            self.out_bias,
        )
        targets = int((ahead_labels != PAD_ID).sum())
        return ModelOutput(loss=loss, hidden=hidden, num_targets=targets)

    def _targets_ahead(
        self, batch: SeqBatch, labels: Tensor, real: Tensor
    ) -> tuple[SeqBatch, Tensor]:
        """The T targets of each position as T stacked copies of the batch: copy k has the
        labels (and per-position negatives) of position t + k at position t.

        Returns the stacked batch and its labels (T * B, L); only real input positions keep
        a target.
        """
        copies, negs = [], []
        negatives = batch.negatives
        if negatives is not None and negatives.dim() == 3:
            negatives = negatives[:, -labels.size(1) :]
        for k in range(self.config.targets_ahead):
            shift = min(k, labels.size(1))  # T may exceed a batch's width: copies past it are empty
            copies.append(
                F.pad(labels[:, shift:], (0, shift), value=PAD_ID).masked_fill(~real, PAD_ID)
            )
            if negatives is not None and negatives.dim() == 3:  # (B, L, S): shift too
                negs.append(F.pad(negatives[:, shift:], (0, 0, 0, shift), value=PAD_ID))
        stacked = torch.cat(copies)
        if negatives is None:
            return replace(batch, labels=stacked), stacked
        T = self.config.targets_ahead
        repeated = torch.cat(negs) if negs else negatives.repeat(T, 1)  # (B, S) per row
        return replace(batch, labels=stacked, negatives=repeated), stacked

    def score(self, input_ids: Tensor, users: Tensor | None = None) -> Tensor:
        last = self.windows(input_ids[:, -self.config.window :])[:, -1]  # (B, L): newest only
        x = self._with_user(self.encode(last), users)  # (B, 2D)
        return torch.addmm(self.out_bias, x, self.out_emb.weight.T)  # (B, N + 1)
