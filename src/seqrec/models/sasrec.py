"""SASRec: Self-Attentive Sequential Recommendation (Kang & McAuley, ICDM 2018).

Paper: https://arxiv.org/abs/1808.09781 - reference code: github.com/kang205/SASRec
(TensorFlow) and its PyTorch port github.com/pmixer/SASRec.pytorch.

Every switch of the paper's ablation (Table IV) is a config field: positional embedding,
shared vs unshared item embedding, residual connections, dropout, 0-3 blocks, heads, and the
explicit user embedding r = (U_u + F_t) . M_i.

Three block layouts. ``layout: pre_ln`` (the default) is the paper's Eq. 4 read as true
pre-LayerNorm, g'(x) = x + Dropout(g(LN(x))). ``layout: reference`` is the reference code's
block, which is what produced the paper's numbers: only the queries are normalised (keys and
values come from the un-normalised input), the attention residual is added to the normalised
queries, and the FFN residual to the FFN's normalised input. ``layout: post_ln`` is the
BERT-style encoder of RecBole's SASRec (and of DuoRec's reference code, built on it):
LN(x + g(x)) per sublayer, a LayerNorm on the summed input embeddings and none after the last
block (LayerNorm eps 1e-5 as everywhere here; RecBole uses 1e-12). Where dropout goes is a
separate switch: ``dropout_placement: paper`` (each sublayer's output), ``reference`` (the
attention weights and after each FFN layer) or ``bert`` (the attention weights and each
sublayer's output, as BERT and RecBole). The FFN's activation is
``activation`` (ReLU in the paper, GELU in RecBole). The SASRec+ configs (Klenitskiy &
Vasilev 2023) use the reference layout and placement, N(0, 0.02) initialisation
(``init_std``), positions counted from the oldest item of the window (``position_origin:
oldest``), as their code does; that code's initialisation misses the fused W^Q, W^K, W^V of
its nn.MultiheadAttention, which keeps PyTorch's Xavier-uniform (``qkv_init:
xavier_uniform``).

Differences from the reference implementation, all deliberate:
- Padded keys are masked out of attention, by the padding itself, not by kang205's test
  for all-zero keys (pmixer's port masks nothing, so there real positions attend to zero
  vectors at padded positions). Outputs at real positions therefore do not depend on how
  much padding a batch has, which lets training pad each batch only to its longest sequence.
- By default positions are counted from the newest item, which always gets position
  max_seq_len - 1, exactly as with the reference's left padding to max_seq_len.
- The point-wise FFN uses nn.Linear where the reference uses a 1x1 Conv1d (same function).
- The attention sublayer ends with an output projection W^O, as pmixer's port (whose
  nn.MultiheadAttention has one); kang205's code has none: ``attention_projection: false``.
  With one head W^V W^O is a reparametrisation of W^V, not a larger function class.
- Analysis hooks (not in the reference): ``residual_scale`` (alpha) scales the attention
  sublayer's residual branch, x + Attn(LN(x)) -> alpha * x + Attn(LN(x)), at inference
  (Kozaki et al., RecSys 2026); ``encode(..., trace=[])`` appends one ``AttentionRecord`` per
  block with the tensors the block computed. Both are used by ``seqrec.analysis``.
- Losses are computed only at real positions. Besides the paper's BCE with one uniformly
  sampled negative per position, the whole loss menu is available: ``loss: ce`` (full
  softmax cross-entropy, the "SASRec+" of Klenitskiy & Vasilev 2023), sampled softmax with
  logQ correction, gBCE, BPR and GRU4Rec+'s BPR-max / TOP1-max.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqrec.batch import PAD_ID, ModelOutput, SeqBatch
from seqrec.config import ConfigError, check_float
from seqrec.models.base import ScoringRecommender, register_model
from seqrec.models.objective import ItemLossConfig, LossName, dot_product_loss
from seqrec.nn.attention import attention, attention_reference
from seqrec.nn.dropout import Dropout
from seqrec.nn.masks import padding_bias

DropoutPlacement = Literal["paper", "reference", "bert"]
BlockLayout = Literal["pre_ln", "reference", "post_ln"]
FFN_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "identity": lambda x: x,
}


@dataclass(frozen=True, kw_only=True)
class SASRecConfig(ItemLossConfig):
    name: ClassVar[str] = "sasrec"
    hidden_size: int = 50  # d; the paper's default
    num_layers: int = 2  # self-attention blocks b (0-3 in the ablation)
    num_heads: int = 1
    ffn_size: int | None = None  # inner width of the point-wise FFN; None = hidden_size (paper)
    dropout: float = 0.2  # 0.2 on ML-1M, 0.5 on the sparse datasets in the paper
    # "paper": Dropout(g(x)) on each sublayer's output (Eq. 4); "reference": as kang205's
    # code, on the attention weights and after each of the FFN's two layers; "bert": on the
    # attention weights and each sublayer's output (BERT, RecBole).
    dropout_placement: DropoutPlacement = "paper"
    # "pre_ln": x + g(LN(x)) per sublayer (Eq. 4); "reference": kang205's block, LN on the
    # queries only and the residual taken from the normalised input (see the module doc);
    # "post_ln": LN(x + g(x)) per sublayer with LN on the input embeddings (RecBole).
    layout: BlockLayout = "pre_ln"
    # The FFN's; RecBole uses GELU; "identity" makes the FFN linear, as gSASRec's PyTorch port.
    activation: Literal["relu", "gelu", "identity"] = "relu"
    # The output projection W^O after the heads are concatenated, as pmixer's port (and
    # nn.MultiheadAttention); kang205's code and gSASRec's port have none (False).
    attention_projection: bool = True
    # Position 0 is the oldest item of the (up to max_seq_len) window ("oldest", SASRec+'s
    # right padding) or the newest item is always max_seq_len - 1 ("newest", the reference).
    position_origin: Literal["newest", "oldest"] = "newest"
    # How weights start: "xavier_normal" for every matrix and embedding (the reference) or
    # "torch", PyTorch's own defaults, which gSASRec's port keeps (embeddings N(0, 1), linear
    # weights and biases uniform in +-1/sqrt(fan_in)). The padding row is zero in both.
    init: Literal["xavier_normal", "torch"] = "xavier_normal"
    # A number replaces ``init`` with N(0, init_std) for every matrix and embedding (SASRec+,
    # RecBole, Hugging Face); linear biases start at zero.
    init_std: float | None = None
    # None: W^Q, W^K, W^V start as every other matrix; "xavier_uniform": Xavier-uniform over
    # the fused (3D, D) matrix, as nn.MultiheadAttention's in_proj_weight in SASRec+'s code,
    # which that code's N(0, 0.02) initialisation does not reach.
    qkv_init: Literal["xavier_uniform"] | None = None
    positional_embedding: bool = True
    # "learned": a trained P (the paper's choice); "sinusoidal": the fixed sin/cos encodings
    # of Vaswani et al., which the paper tried and found worse
    position_encoding: Literal["learned", "sinusoidal"] = "learned"
    shared_embedding: bool = True  # False: a second item matrix N scores the output
    residual: bool = True
    scale_embedding: bool = True  # item embeddings * sqrt(d), as the reference code does
    user_embedding: bool = False  # r = (U_u + F_t) . M_i
    loss: LossName = "bce"  # the paper's; any of the loss menu (seqrec.models.objective)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.hidden_size % max(self.num_heads, 1) != 0 or self.num_heads < 1:
            raise ConfigError(
                f"model.hidden_size {self.hidden_size} must be divisible by "
                f"model.num_heads {self.num_heads} (>= 1)"
            )
        if self.num_layers < 0:
            raise ConfigError(f"model.num_layers must be >= 0, got {self.num_layers}")
        check_float("model.dropout", self.dropout, at_least=0.0, below=1.0)
        if self.user_embedding and self.num_users < 1:
            raise ConfigError("model.user_embedding needs the number of users from the data")
        check_float("model.init_std", self.init_std, above=0.0, nullable=True)
        if not self.positional_embedding:
            self.warn_unread(
                ("position_origin", "position_encoding"), "with model.positional_embedding: false"
            )
        if self.init_std is not None and self.init != "xavier_normal":
            raise ConfigError(
                f"model.init_std {self.init_std} replaces model.init; set one of them, not "
                f"both (model.init is {self.init!r})"
            )


class SelfAttention(nn.Module):
    """Multi-head causal self-attention with separate W^Q, W^K, W^V (fused in one Linear)."""

    def __init__(self, config: SASRecConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.dropout = config.dropout if config.dropout_placement != "paper" else 0.0
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        D = config.hidden_size
        self.proj: nn.Module = nn.Linear(D, D) if config.attention_projection else nn.Identity()

    def forward(
        self,
        x: Tensor,
        mask: Tensor,
        need_weights: bool = False,
        last_only: bool = False,
        kv: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """(B, L, D) -> (B, L, D), or (B, 1, D) for the newest position with ``last_only``.

        Queries come from ``x``; keys and values from ``kv`` when given, else from ``x``.
        """
        B, _, D = x.shape
        if last_only:  # inference: keys and values for all positions, one query
            source = x if kv is None else kv
            k, v = self.key_values(source)
            q = F.linear(x[:, -1:], self.qkv.weight[:D], self.qkv.bias[:D])
            mask = mask[:, :, -1:]
        elif kv is None:
            q, k, v = self.qkv(x).split(D, dim=-1)
        else:
            q = F.linear(x, self.qkv.weight[:D], self.qkv.bias[:D])
            k, v = self.key_values(kv)
        # (B, L, D) -> (B, H, L, D / H)
        H = self.num_heads
        q, k, v = (t.view(B, -1, H, D // H).transpose(1, 2) for t in (q, k, v))
        weights = None
        if need_weights:  # the readable path, attention weights kept for analysis
            y, weights = attention_reference(q, k, v, mask, self.dropout, self.training)
        else:
            y = attention(q, k, v, mask, self.dropout, self.training)
        return self.proj(y.transpose(1, 2).reshape(B, -1, D)), weights

    def output_projection(self) -> tuple[Tensor, Tensor]:
        """(W_O (D, D), b_O (D,)) with proj(y) = y @ W_O.T + b_O; the identity and zeros when
        the model has no output projection."""
        if isinstance(self.proj, nn.Linear):
            return self.proj.weight, self.proj.bias
        weight = self.qkv.weight
        D = weight.size(1)
        return torch.eye(D, dtype=weight.dtype, device=weight.device), weight.new_zeros(D)

    def key_values(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(B, L, D) -> keys and values, each (B, L, D)."""
        D = x.size(-1)
        k, v = torch.split(F.linear(x, self.qkv.weight[D:], self.qkv.bias[D:]), D, dim=-1)
        return k, v


class FeedForward(nn.Module):
    """F_i = ReLU(S_i W1 + b1) W2 + b2 (GELU or no activation with ``activation``), the same
    weights at every position."""

    def __init__(self, config: SASRecConfig) -> None:
        super().__init__()
        inner = config.ffn_size or config.hidden_size
        self.fc1 = nn.Linear(config.hidden_size, inner)
        self.fc2 = nn.Linear(inner, config.hidden_size)
        # The reference code drops after each layer; the paper drops the sublayer output.
        p = config.dropout if config.dropout_placement == "reference" else 0.0
        self.dropout = Dropout(p)
        self.activation = FFN_ACTIVATIONS[config.activation]

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.fc2(self.dropout(self.activation(self.fc1(x)))))


@dataclass(frozen=True)
class AttentionRecord:
    """What one block computed on its attention sublayer, for analysis (``encode(trace=...)``).

    The sublayer computes ``y = alpha * x + Attn(...)``, where ``x`` is the residual branch:
    the block input in the pre-LN layout, the normalised queries LN_attn(input) in the
    reference layout. The LayerNorm that follows the residual sum is the FFN sublayer's input
    norm, ``ln_ffn(y)``, which the FFN reads. Tensors are the ones the model used (no
    copies); ``attn`` and ``ln`` are the block's own modules (weights by reference).
    """

    x: Tensor  # (B, L, D) the attention sublayer's residual branch
    attn_input: Tensor  # (B, L, D) what the queries are computed from: LN_attn(block input),
    # the block input itself in the post-LN layout
    weights: Tensor  # (B, H, L, L) attention weights (rows: queries, columns: keys)
    values: Tensor  # (B, H, L, D / H) value vectors, per head
    attn_output: Tensor  # (B, L, D) Attn(x) = concat_h(weights_h @ values_h) W_O^T + b_O
    residual_scale: float  # alpha, 0.0 when the model has no residual connections
    pre_ln: Tensor  # (B, L, D) y = alpha * x + Attn(x), the residual sum
    ln_output: Tensor  # (B, L, D) the LayerNorm applied to the residual sum (the FFN's input)
    attn: SelfAttention  # its proj is W_O, b_O
    ln: nn.LayerNorm  # gamma, beta, eps of that LayerNorm: ln_ffn (ln_attn when post-LN)


class Block(nn.Module):
    """Pre-LN: x + Dropout(Attn(LN(x))), then x + Dropout(FFN(LN(x))) (paper, Eq. 4).

    The reference layout: h = LN(x) + Attn(q = LN(x), kv = x), then LN(h) + FFN(LN(h)).
    The post-LN layout: h = LN_attn(x + Attn(x)), then LN_ffn(h + FFN(h)).
    With ``dropout_placement: reference`` the two outer dropouts are off and the attention
    weights and FFN layers drop instead, as in the reference code. ``residual_scale`` (alpha)
    multiplies the attention sublayer's residual branch only; the FFN residual is untouched.
    """

    def __init__(self, config: SASRecConfig) -> None:
        super().__init__()
        self.residual = config.residual
        self.reference_layout = config.layout == "reference"
        self.post_ln = config.layout == "post_ln"
        self.ln_attn = nn.LayerNorm(config.hidden_size)
        self.attn = SelfAttention(config)
        self.ln_ffn = nn.LayerNorm(config.hidden_size)
        self.ffn = FeedForward(config)
        outer = config.dropout_placement in ("paper", "bert")
        self.dropout = Dropout(config.dropout if outer else 0.0)

    @property
    def residual_ln(self) -> nn.LayerNorm:
        """The LayerNorm applied to the attention residual sum, whose output the FFN reads."""
        return self.ln_attn if self.post_ln else self.ln_ffn

    def forward(
        self,
        x: Tensor,
        mask: Tensor,
        need_weights: bool = False,
        last_only: bool = False,
        residual_scale: float = 1.0,
        trace: list[AttentionRecord] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        attn_input = x if self.post_ln else self.ln_attn(x)
        need_weights = need_weights or trace is not None
        # The reference layout reads keys and values from the un-normalised input and adds
        # the attention residual to the normalised queries.
        kv_input = x if self.reference_layout else attn_input
        branch = attn_input if self.reference_layout else x
        attended, weights = self.attn(attn_input, mask, need_weights, last_only, kv=kv_input)
        attended = self.dropout(attended)
        if last_only:
            branch = branch[:, -1:]
        residual = branch if residual_scale == 1.0 else residual_scale * branch
        y = residual + attended if self.residual else attended
        normed = self.residual_ln(y)
        if trace is not None:
            assert weights is not None
            values = self.attn.key_values(kv_input)[1]
            trace.append(
                self._record(
                    branch, attn_input, values, weights, attended, residual_scale, y, normed
                )
            )
        fed = self.dropout(self.ffn(normed))
        ffn_branch = normed if self.reference_layout or self.post_ln else y
        x = ffn_branch + fed if self.residual else fed
        return (self.ln_ffn(x) if self.post_ln else x), weights

    def _record(
        self,
        branch: Tensor,
        attn_input: Tensor,
        values: Tensor,
        weights: Tensor,
        attended: Tensor,
        residual_scale: float,
        y: Tensor,
        normed: Tensor,
    ) -> AttentionRecord:
        B, L, D = branch.shape
        H = self.attn.num_heads
        return AttentionRecord(
            x=branch,
            attn_input=attn_input,
            weights=weights,
            values=values.view(B, L, H, D // H).transpose(1, 2),
            attn_output=attended,
            residual_scale=residual_scale if self.residual else 0.0,
            pre_ln=y,
            ln_output=normed,
            attn=self.attn,
            ln=self.residual_ln,
        )


def sinusoidal_positions(positions: int, width: int) -> Tensor:
    """(positions, width) fixed encodings: sin(p / 10000^(2i / width)) in column 2i and the
    matching cos in column 2i + 1 (Vaswani et al., 2017)."""
    p = torch.arange(positions, dtype=torch.float64).unsqueeze(1)
    rates = 10000.0 ** (-torch.arange(0, width, 2, dtype=torch.float64) / width)
    table = torch.zeros(positions, width, dtype=torch.float64)
    table[:, 0::2] = torch.sin(p * rates)
    table[:, 1::2] = torch.cos(p * rates[: width // 2])
    return table.float()


@register_model
class SASRec(ScoringRecommender):
    config_class = SASRecConfig
    config: SASRecConfig

    def __init__(self, config: SASRecConfig) -> None:
        super().__init__(config)
        D = config.hidden_size
        self.item_emb = nn.Embedding(config.num_items + 1, D, padding_idx=PAD_ID)
        self.pos_emb = nn.Embedding(config.max_seq_len, D) if config.positional_embedding else None
        self.out_emb = (
            None
            if config.shared_embedding
            else nn.Embedding(config.num_items + 1, D, padding_idx=PAD_ID)
        )
        self.user_emb = nn.Embedding(config.num_users, D) if config.user_embedding else None
        self.emb_dropout = Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        # Post-LN normalises the summed embeddings instead of the last block's output.
        post_ln = config.layout == "post_ln"
        self.emb_ln: nn.Module = nn.LayerNorm(D) if post_ln else nn.Identity()
        self.ln_f: nn.Module = nn.Identity() if post_ln else nn.LayerNorm(D)
        self.apply(self._init_weights)
        if self.pos_emb is not None and config.position_encoding == "sinusoidal":
            with torch.no_grad():
                self.pos_emb.weight.copy_(sinusoidal_positions(config.max_seq_len, D))
            self.pos_emb.weight.requires_grad_(False)
        self._residual_scale = 1.0

    @property
    def residual_scale(self) -> float:
        """alpha on every block's attention residual, h = alpha * x + Attn(x); 1.0 = trained.

        An inference-time probe (Kozaki et al., RecSys 2026, Sec. 5), not a hyperparameter:
        it is not part of the config and is never saved. See ``seqrec.analysis.residual_scale``.
        """
        return self._residual_scale

    @residual_scale.setter
    def residual_scale(self, value: float) -> None:
        if not math.isfinite(value):
            raise ValueError(f"residual_scale must be a finite number, got {value}")
        self._residual_scale = float(value)

    def _init_weights(self, module: nn.Module) -> None:
        # Xavier-normal for matrices as in the reference (pmixer: xavier_normal_ on every
        # weight), N(0, init_std) or PyTorch's defaults as built; LayerNorm keeps its
        # ones/zeros; the padding row stays zero.
        if isinstance(module, (nn.Linear, nn.Embedding)) and self.config.init != "torch":
            if self.config.init_std is None:
                nn.init.xavier_normal_(module.weight)
            else:
                nn.init.normal_(module.weight, 0.0, self.config.init_std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        if isinstance(module, SelfAttention) and self.config.qkv_init == "xavier_uniform":
            nn.init.xavier_uniform_(module.qkv.weight)

    @property
    def uses_users(self) -> bool:
        return self.config.user_embedding

    def output_embedding(self) -> Tensor:
        """(N + 1, D) the matrix that scores items: M (shared) or N (unshared)."""
        return (self.out_emb or self.item_emb).weight

    def encode(
        self,
        input_ids: Tensor,
        need_weights: bool = False,
        last_only: bool = False,
        trace: list[AttentionRecord] | None = None,
    ) -> tuple[Tensor, list[Tensor]]:
        """(B, L) left-padded item ids -> (B, L, D) hidden states, plus per-layer attention
        weights (B, H, L, L) when ``need_weights``.

        ``last_only`` returns (B, 1, D) for the newest position and skips the last block's
        work for the other positions (what scoring needs). ``trace``, a list, receives one
        ``AttentionRecord`` per block (all positions; needs eval mode, not ``last_only``).
        """
        if trace is not None and (last_only or self.training):
            raise ValueError(
                "encode(trace=...) needs eval mode and all positions (last_only=False)"
            )
        input_ids = input_ids[:, -self.config.max_seq_len :]
        x = self.embed(input_ids)
        real = input_ids != PAD_ID
        mask = padding_bias(real, causal=True, dtype=x.dtype)  # (B, 1, L, L)
        weights: list[Tensor] = []
        for index, block in enumerate(self.blocks):
            last = last_only and index == len(self.blocks) - 1
            x, w = block(x, mask, need_weights, last, self._residual_scale, trace)
            if w is not None and need_weights:
                weights.append(w)
        return self.ln_f(x), weights

    def embed(self, input_ids: Tensor) -> Tensor:
        """(B, L) left-padded item ids, at most max_seq_len -> (B, L, D) the first block's
        input: (scaled) item embeddings plus positions (normalised when post-LN), dropped
        out, zero at padding."""
        x = self.item_emb(input_ids)
        if self.config.scale_embedding:
            x = x * self.config.hidden_size**0.5
        real = input_ids != PAD_ID  # (B, L)
        if self.pos_emb is not None:
            x = x + self.pos_emb(self._positions(real))
        return self.emb_dropout(self.emb_ln(x)) * real.unsqueeze(-1)

    def _positions(self, real: Tensor) -> Tensor:
        """Position indices for left-padded rows: (L,) counted from the newest item, which is
        always max_seq_len - 1, or (B, L) counted from each row's oldest item (0)."""
        if self.config.position_origin == "oldest":
            return (real.cumsum(dim=1) - 1).clamp(min=0)
        L = real.size(1)
        return torch.arange(
            self.config.max_seq_len - L, self.config.max_seq_len, device=real.device
        )

    def _user_vector(self, users: Tensor | None) -> Tensor | None:
        """(B, D) U_u for the model with a user embedding; None otherwise."""
        if self.user_emb is None:
            return None
        if users is None:
            raise ValueError("this SASRec has a user embedding: pass the user indices")
        return self.user_emb(users)

    def forward(self, batch: SeqBatch) -> ModelOutput:
        if batch.labels is None:
            raise ValueError("SASRec.forward needs batch.labels")
        hidden, _ = self.encode(batch.input_ids)  # (B, L, D)
        labels = batch.labels[:, -hidden.size(1) :]
        user = self._user_vector(batch.users)
        if user is not None:
            hidden = hidden + user.unsqueeze(1)
        loss = dot_product_loss(self.config, hidden, labels, batch, self.output_embedding())
        return ModelOutput(loss=loss, hidden=hidden)

    def newest_state(self, input_ids: Tensor) -> Tensor:
        """(B, L) -> (B, D) hidden state at the newest position (left padding puts it last),
        with the current dropout; no user vector."""
        hidden, _ = self.encode(input_ids, last_only=True)
        return hidden[:, -1]

    def score(self, input_ids: Tensor, users: Tensor | None = None) -> Tensor:
        last = self.newest_state(input_ids)  # (B, D)
        user = self._user_vector(users)
        if user is not None:
            last = last + user
        return last @ self.output_embedding().T  # (B, N + 1)
