"""Mamba4Rec: efficient sequential recommendation with selective state space models
(Liu, Li, Xu, Ye, Cheng and Yang, 2024).

Paper: https://arxiv.org/abs/2403.03900 - reference code: github.com/chengkai-liu/Mamba4Rec
(RecBole, with ``mamba_ssm.Mamba`` as the block).

    H = LayerNorm(Dropout(S E))                                   item embedding
    Mamba layer, num_layers times:
      X, Z = H W_in (widened by expand E);  X' = SiLU(causal depthwise conv_K(X))
      Delta = softplus(dt_proj(x_proj(X'))), B = x_proj(X'), C = x_proj(X')
      Y = selective_scan(X', Delta, A = -exp(A_log), B, C, D);  M = (Y * SiLU(Z)) W_out
      H = LayerNorm(Dropout(M))        one layer: no residual (the paper's default)
      H = LayerNorm(Dropout(M) + H)    stacked layers: residual connections
      H = LayerNorm(Dropout(GELU(H W1 + b1) W2 + b2) + H)        PFFN, inner width 4 D
    scores = h_last E^T, trained with full softmax cross-entropy.

The residual structure is the reference code's: the "no residual with one layer" of the
paper is the Mamba block's; the PFFN always adds its input back before its LayerNorm (the
code's ``FeedForward``), whatever the number of layers. The recurrence gives O(1)-per-item
serving: ``init_state`` encodes a history, ``step`` appends one item per user.

Differences from the reference implementation, all deliberate:
- Left padding, as everywhere in seqrec, where RecBole pads on the right. Padding must then
  be kept out of the causal conv and the recurrence: every layer's input is zeroed at padded
  positions (in_proj has no bias, so the conv sees the zero left-padding it would see on a
  shorter sequence), and Delta = 0 there, which makes a padded step the identity on the
  state. Scores therefore do not depend on how much padding a batch has.
- The loss is full softmax cross-entropy at every real position of a history (seqrec's
  training batches), not only at the last position of every prefix (RecBole's data
  augmentation): the same targets, seen in one pass. With ``train.windows: all`` a long
  history trains in consecutive windows of max_seq_len items, so a target early in a window
  sees fewer items before it than RecBole's prefix, which always holds the max_seq_len before;
  ``train.window_stride: s`` gives every target at least max_seq_len - s + 1 (s = 1: the same).
- Evaluation is the library's; the ML-1M configs rank seen items too
  (``eval.filter_seen: false``), as RecBole's full sort does for sequential models, which
  produced the paper's numbers.
- The padding row of the item embedding is zero (the reference's init overwrites it; with
  right padding it never reaches an output).
- The selective scan runs on CPU too: ``scan: auto`` takes the mamba-ssm kernel on CUDA
  tensors and seqrec's compiled numba kernel on CPU tensors when they are installed, and
  ``seqrec.nn.selective_scan``'s chunked fast path otherwise. With the numba kernel, a block
  that needs no recurrent state (training, scoring) runs as one fused function,
  ``seqrec.nn.mamba_inner``: the same computation, with a fraction of the activation memory.
- ``positional_embedding: true`` (the paper's ablation) adds learned positions counted from
  the oldest item of the (truncated) history, as RecBole's position ids are.
- ``ffn: false`` drops the PFFN (the paper's "Mamba block only" ablation).

Kept from the reference on purpose: its initialisation, which applies normal(0, 0.02) to
every Linear and Embedding weight and zeroes every Linear bias. This overwrites mamba-ssm's
own dt_proj init, so Delta starts at softplus(0) = 0.69 everywhere; A_log keeps the S4D-real
init log(1..N) and D = 1. LayerNorm eps is 1e-12 as in the code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqrec.batch import PAD_ID, ModelOutput, SeqBatch
from seqrec.config import ConfigError, check_float
from seqrec.losses import fused_full_ce
from seqrec.models.base import ModelConfig, ScoringRecommender, register_model
from seqrec.nn.dropout import Dropout
from seqrec.nn.feed_forward import fused_ffn_applies, gelu_ffn_residual
from seqrec.nn.mamba_inner import fused_block_applies, mamba_inner_numba
from seqrec.nn.selective_scan import (
    ScanImpl,
    check_scan_impl,
    log_auto_choice,
    numba_available,
    numpy_views,
    selective_scan,
)

LN_EPS = 1e-12  # the reference code's LayerNorm eps


@dataclass(frozen=True, kw_only=True)
class Mamba4RecConfig(ModelConfig):
    name: ClassVar[str] = "mamba4rec"
    max_seq_len: int = 200  # ML-1M in the paper; 50 on the Amazon datasets
    hidden_size: int = 64  # D
    state_size: int = 32  # N, the SSM state per channel
    conv_kernel: int = 4  # K, causal depthwise convolution width
    expand: int = 2  # E, the block's inner width is E * D
    num_layers: int = 1
    dropout: float = 0.2  # 0.2 on ML-1M, 0.4 on Beauty and Video-Games in the paper
    positional_embedding: bool = False  # ablation: learned positions (hurts in the paper)
    ffn: bool = True  # ablation: False keeps only the Mamba block in each layer
    scan: ScanImpl = "auto"  # selective scan implementation (seqrec.nn.selective_scan)
    at_least_one: ClassVar[tuple[str, ...]] = ("conv_kernel", "expand", "num_layers")
    # The scan is how, not what, the block computes: a run trained with the CUDA kernel is
    # evaluated or served on a machine without it, and a warm start may change it.
    inference_settings: ClassVar[tuple[str, ...]] = ("scan",)
    warm_start_free: ClassVar[tuple[str, ...]] = ("scan",)
    kernel_settings: ClassVar[tuple[str, ...]] = ("scan",)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_float("model.dropout", self.dropout, at_least=0.0, below=1.0)

    def check_runnable(self, device: str | None = None) -> None:
        kernel_device = {"numba": "cpu", "cuda": "cuda"}.get(self.scan)
        if device is not None and kernel_device not in (None, device):
            raise ConfigError(
                f"model.scan {self.scan!r} runs on {kernel_device} tensors, and this model is "
                f"on {device}: use model.scan auto (or set train.device {kernel_device})"
            )
        try:
            check_scan_impl(self.scan)
        except RuntimeError as err:
            raise ConfigError(
                f"model.scan {self.scan!r}: {err} (a run trained with it is evaluated or served "
                "here with --set model.scan=auto)"
            ) from None

    @property
    def inner_size(self) -> int:
        return self.expand * self.hidden_size

    @property
    def loss_splits_by_rows(self) -> bool:
        return True  # full softmax CE at every real position

    @property
    def dt_rank(self) -> int:
        """Rank of the Delta projection, ceil(D / 16) as in mamba-ssm."""
        return math.ceil(self.hidden_size / 16)


@dataclass(frozen=True)
class MambaState:
    """A batch of users' recurrent state after their latest item, one entry per layer.

    conv: (B, E*D, K - 1) the block's last K - 1 conv inputs; ssm: (B, E*D, N) the SSM state;
    length: (B,) items seen so far (the position of the next item when positions are on).
    """

    conv: tuple[Tensor, ...]
    ssm: tuple[Tensor, ...]
    length: Tensor


class MambaBlock(nn.Module):
    """mamba-ssm's ``Mamba`` block (v1, the simple path), parameter names included."""

    def __init__(self, config: Mamba4RecConfig) -> None:
        super().__init__()
        D, inner, N, R = config.hidden_size, config.inner_size, config.state_size, config.dt_rank
        self.in_proj = nn.Linear(D, 2 * inner, bias=False)  # x and the gate z
        self.conv1d = nn.Conv1d(
            inner, inner, config.conv_kernel, groups=inner, padding=config.conv_kernel - 1
        )
        self.x_proj = nn.Linear(inner, R + 2 * N, bias=False)  # Delta (low rank), B, C
        self.dt_proj = nn.Linear(R, inner)
        # S4D-real: A = -(1, 2, ..., N) in every channel, kept as log(-A).
        A = torch.arange(1, N + 1, dtype=torch.float32).repeat(inner, 1)  # (E*D, N)
        self.A_log = nn.Parameter(torch.log(A))
        self.D = nn.Parameter(torch.ones(inner))
        self.out_proj = nn.Linear(inner, D, bias=False)

    def _ssm_inputs(self, u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(..., E*D) conv output -> Delta (..., E*D), B (..., N), C (..., N)."""
        R, N = self.dt_proj.in_features, self.A_log.size(1)
        dt, B, C = self.x_proj(u).split([R, N, N], dim=-1)
        return F.softplus(self.dt_proj(dt)), B, C

    def forward(
        self, x: Tensor, real: Tensor, scan: ScanImpl, return_state: bool, last_only: bool
    ) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """(B, L, D) with real (B, L) -> (B, L, D), or (B, 1, D) for the newest position with
        ``last_only``, plus the (conv, ssm) states after it with ``return_state``.

        Padded positions must hold zeros in ``x`` (the caller masks them).
        """
        L = x.size(1)
        if not return_state and scan in ("auto", "numba") and fused_block_applies(x):
            if scan == "auto":
                log_auto_choice("numba", "cpu")
            out = mamba_inner_numba(
                x,
                real,
                self.in_proj.weight,
                self.conv1d.weight,
                self.conv1d.bias,
                self.x_proj.weight,
                self.dt_proj.weight,
                self.dt_proj.bias,
                self.A_log,
                self.D,
                self.out_proj.weight,
                newest_only=last_only,
            )
            return out, None
        xs, z = self.in_proj(x).chunk(2, dim=-1)  # (B, L, E*D) each
        xs = xs.transpose(1, 2)  # (B, E*D, L)
        u = F.silu(self.conv1d(xs)[..., :L])  # causal: the output at t sees t-K+1..t
        # Padded positions: no input (the conv bias would make one) and Delta = 0, so the
        # step is exactly the identity on the state. Either alone keeps the zero initial
        # state zero through left padding; both make the padded steps exact no-ops.
        u = u * real.unsqueeze(1)
        delta, B, C = self._ssm_inputs(u.transpose(1, 2))
        delta = delta * real.unsqueeze(-1)
        A = -torch.exp(self.A_log.float())  # (E*D, N)
        y, last = selective_scan(
            u.float(),
            delta.transpose(1, 2).float(),
            A,
            B.transpose(1, 2).float(),
            C.transpose(1, 2).float(),
            self.D.float(),
            impl=scan,
            return_last_state=return_state,
        )  # (B, E*D, L)
        y = y.transpose(1, 2).to(z.dtype)  # (B, L, E*D)
        if last_only:
            y, z = y[:, -1:], z[:, -1:]
        out = self.out_proj(y * F.silu(z))
        if last is None:
            return out, None
        # The conv window after the newest item: its last K - 1 inputs, zeros before the start.
        conv = F.pad(xs, (self.conv1d.kernel_size[0] - 1, 0))[..., L:]
        return out, (conv, last)

    def step(self, x: Tensor, conv: Tensor, ssm: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One new position: x (B, D), conv (B, E*D, K-1), ssm (B, E*D, N) -> the same, updated."""
        xs, z = self.in_proj(x).chunk(2, dim=-1)  # (B, E*D)
        window = torch.cat([conv, xs.unsqueeze(-1)], dim=-1)  # (B, E*D, K)
        # The depthwise conv's one output for a K-wide window, written out: F.conv1d on a
        # window this small costs more in dispatch than the arithmetic.
        conv_out = (window * self.conv1d.weight[:, 0]).sum(-1)  # (B, E*D)
        if self.conv1d.bias is not None:
            conv_out = conv_out + self.conv1d.bias
        u = F.silu(conv_out)
        delta, B, C = self._ssm_inputs(u)
        A = -torch.exp(self.A_log.float())
        decay = torch.exp(delta.unsqueeze(-1) * A)  # (B, E*D, N)
        ssm = decay * ssm + (delta * u).unsqueeze(-1) * B.unsqueeze(1)
        y = (ssm * C.unsqueeze(1)).sum(-1) + self.D * u  # (B, E*D)
        return self.out_proj(y * F.silu(z)), window[..., 1:], ssm


class FeedForward(nn.Module):
    """LayerNorm(Dropout(GELU(H W1 + b1) W2 + b2) + H): the reference's FeedForward, whose
    residual does not depend on the number of layers; dropout also after the GELU.

    On float32 CPU tensors everything before the LayerNorm is ``gelu_ffn_residual``: the
    same computation with a fraction of the memory, and dropout masks from a hash of each
    element's index (``seqrec.nn.hashed_dropout``) instead of torch's generator."""

    def __init__(self, config: Mamba4RecConfig) -> None:
        super().__init__()
        D = config.hidden_size
        self.w_1 = nn.Linear(D, 4 * D)
        self.w_2 = nn.Linear(4 * D, D)
        self.dropout = Dropout(config.dropout)
        self.norm = nn.LayerNorm(D, eps=LN_EPS)

    def forward(self, x: Tensor) -> Tensor:
        if fused_ffn_applies(x):  # the same, a chunk of positions at a time: less memory
            summed = gelu_ffn_residual(
                x, self.w_1.weight, self.w_1.bias, self.w_2.weight, self.w_2.bias,
                self.dropout.p, self.training,
            )  # fmt: skip
        else:
            summed = self.dropout(self.w_2(self.dropout(F.gelu(self.w_1(x))))) + x
        out: Tensor = self.norm(summed)
        return out


class MambaLayer(nn.Module):
    """Mamba block -> Dropout -> (+ input when stacked) -> LayerNorm -> PFFN (optional)."""

    def __init__(self, config: Mamba4RecConfig) -> None:
        super().__init__()
        self.residual = config.num_layers > 1  # the reference: no residual with one layer
        self.mamba = MambaBlock(config)
        self.dropout = Dropout(config.dropout)
        self.norm = nn.LayerNorm(config.hidden_size, eps=LN_EPS)
        self.ffn = FeedForward(config) if config.ffn else None

    def _finish(self, mixed: Tensor, x: Tensor) -> Tensor:
        mixed = self.dropout(mixed)
        hidden: Tensor = self.norm(mixed + x if self.residual else mixed)
        return hidden if self.ffn is None else self.ffn(hidden)

    def forward(
        self, x: Tensor, real: Tensor, scan: ScanImpl, return_state: bool, last_only: bool
    ) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """(B, L, D) -> (B, L, D), or (B, 1, D) for the newest position with ``last_only``."""
        x = x * real.unsqueeze(-1)  # padding must enter the block as zeros
        mixed, state = self.mamba(x, real, scan, return_state, last_only)
        # Position-wise from here on: with last_only, only the newest position is finished.
        return self._finish(mixed, x[:, -mixed.size(1) :]), state

    def step(self, x: Tensor, conv: Tensor, ssm: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        mixed, conv, ssm = self.mamba.step(x, conv, ssm)
        return self._finish(mixed, x), conv, ssm

    def kernel_tensors(self) -> list[Tensor]:
        """The parameters as ``seqrec.nn.step_kernel.layer_step`` reads them, in its order
        (A_log where it takes A; no PFFN: empty stand-ins)."""
        block, ffn = self.mamba, self.ffn
        if ffn is None:
            no_rows, nothing = block.D.new_empty(0, self.norm.weight.numel()), block.D.new_empty(0)
            ffn_weights = [no_rows, nothing, no_rows.T, nothing, nothing, nothing]
        else:
            ffn_weights = [ffn.w_1.weight, ffn.w_1.bias, ffn.w_2.weight, ffn.w_2.bias]
            ffn_weights += [ffn.norm.weight, ffn.norm.bias]
        return [
            block.A_log, block.in_proj.weight, block.conv1d.weight, _conv_bias(block.conv1d),
            block.x_proj.weight, block.dt_proj.weight, block.dt_proj.bias, block.D,
            block.out_proj.weight, self.norm.weight, self.norm.bias, *ffn_weights,
        ]  # fmt: skip

    def kernel_arguments(self) -> tuple[Any, ...]:
        """``layer_step``'s arguments between A and the outputs: numpy views of the
        parameters (sharing their memory) and the layer's settings."""
        _, in_proj, conv, *rest = self.kernel_tensors()
        arrays = numpy_views(in_proj, conv[:, 0], *rest)
        return (*arrays[:10], self.residual, *arrays[10:], self.norm.eps)


def _conv_bias(conv: nn.Conv1d) -> Tensor:
    return conv.bias if conv.bias is not None else conv.weight.new_zeros(conv.out_channels)


# Parameters registered on any module anywhere, counted so that the compiled step's cached
# weights notice a parameter replaced by another (``load_state_dict(assign=True)``, ``=``).
_registrations = 0


def _count_registration(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
    global _registrations
    _registrations += 1


torch.nn.modules.module.register_module_parameter_registration_hook(_count_registration)


@dataclass(frozen=True)
class _KernelWeights:
    """The compiled step's arguments, and the parameters they view."""

    registrations: int
    tensors: tuple[Tensor, ...]
    pointers: tuple[int, ...]  # where their memory was: a moved parameter (``.to``) invalidates
    embedding: tuple[Any, ...]  # embed_items' arguments between the positions and the output
    layers: tuple[tuple[Any, ...], ...]  # layer_step's between A and the outputs, per layer

    def valid(self) -> bool:
        same_memory = (t.data_ptr() == p for t, p in zip(self.tensors, self.pointers, strict=True))
        return self.registrations == _registrations and all(same_memory)


@register_model
class Mamba4Rec(ScoringRecommender):
    config_class = Mamba4RecConfig
    config: Mamba4RecConfig

    def __init__(self, config: Mamba4RecConfig) -> None:
        config.check_runnable()  # an unusable scan fails here, not mid-training
        super().__init__(config)
        D = config.hidden_size
        self.item_emb = nn.Embedding(config.num_items + 1, D, padding_idx=PAD_ID)
        self.pos_emb = nn.Embedding(config.max_seq_len, D) if config.positional_embedding else None
        self.emb_dropout = Dropout(config.dropout)
        self.emb_norm = nn.LayerNorm(D, eps=LN_EPS)
        self.layers = nn.ModuleList(MambaLayer(config) for _ in range(config.num_layers))
        self.apply(self._init_weights)
        self._kernel_cache: _KernelWeights | None = None

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # The reference's RecBole init (see the module docstring); Conv1d keeps PyTorch's.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()

    def _check_positions(self, largest: int) -> None:
        if largest >= self.config.max_seq_len:
            raise ValueError(
                f"positional_embedding covers {self.config.max_seq_len} items; "
                "a longer history cannot be encoded"
            )

    def _embed(self, input_ids: Tensor, positions: Tensor | None) -> Tensor:
        """(B, L) ids and positions -> LayerNorm(Dropout(E + P)): (B, L, D).

        Positions count from the oldest real item (RecBole's right-padded position ids); None
        derives them from the padding of ``input_ids``.
        """
        x = self.item_emb(input_ids)
        if self.pos_emb is not None:
            if positions is None:
                positions = ((input_ids != PAD_ID).cumsum(dim=1) - 1).clamp(min=0)
            self._check_positions(int(positions.max()))
            x = x + self.pos_emb(positions)
        out: Tensor = self.emb_norm(self.emb_dropout(x))
        return out

    def encode(
        self, input_ids: Tensor, last_only: bool = False, return_state: bool = False
    ) -> tuple[Tensor, MambaState | None]:
        """(B, L) left-padded ids -> (B, L, D) hidden states, or (B, 1, D) for the newest
        position with ``last_only``; with ``return_state`` also the state after the newest.

        No truncation here: callers cut to max_seq_len (``forward``, ``score``).
        """
        real = input_ids != PAD_ID  # (B, L)
        x = self._embed(input_ids, None)
        convs, ssms = [], []
        for index, layer in enumerate(self.layers):
            last = last_only and index == len(self.layers) - 1
            x, state = layer(x, real, self.config.scan, return_state, last)
            if state is not None:
                convs.append(state[0])
                ssms.append(state[1])
        if not return_state:
            return x, None
        return x, MambaState(tuple(convs), tuple(ssms), real.sum(dim=1))

    def forward(self, batch: SeqBatch) -> ModelOutput:
        if batch.labels is None:
            raise ValueError("Mamba4Rec.forward needs batch.labels")
        input_ids = batch.input_ids[:, -self.config.max_seq_len :]
        hidden, _ = self.encode(input_ids)  # (B, L, D)
        labels = batch.labels[:, -hidden.size(1) :]
        where = (labels != PAD_ID).view(-1).nonzero().squeeze(1)  # (P,) real positions
        h = hidden.reshape(-1, hidden.size(-1)).index_select(0, where)  # (P, D)
        targets = labels.reshape(-1).index_select(0, where).long()  # (P,)
        return ModelOutput(loss=fused_full_ce(h, self.item_emb.weight, targets), hidden=hidden)

    def score(self, input_ids: Tensor, users: Tensor | None = None) -> Tensor:
        hidden, _ = self.encode(input_ids[:, -self.config.max_seq_len :], last_only=True)
        return hidden[:, -1] @ self.item_emb.weight.T  # (B, N + 1)

    @torch.no_grad()
    def init_state(self, input_ids: Tensor) -> tuple[MambaState, Tensor]:
        """Encode whole (B, L) left-padded histories: their state and (B, N + 1) scores.

        No truncation to max_seq_len: the state is that of the full history, which is what
        ``step`` extends. ``score`` equals it for histories up to max_seq_len items; for
        longer ones ``score`` sees only the most recent max_seq_len. With a positional
        embedding, which has no position past max_seq_len, the state is that of the most
        recent max_seq_len items, as ``score`` reads them (see ``state_horizon``).
        """
        if self.pos_emb is not None:
            input_ids = input_ids[:, -self.config.max_seq_len :]
        hidden, state = self.encode(input_ids, last_only=True, return_state=True)
        assert state is not None
        return state, hidden[:, -1] @ self.item_emb.weight.T

    @property
    def state_horizon(self) -> int | None:
        """The most items a state can hold: none without a positional embedding; with one,
        max_seq_len (``step`` refuses to go past it: a caller re-encodes the most recent
        max_seq_len items instead, as ``score`` reads them)."""
        return None if self.pos_emb is None else self.config.max_seq_len

    def _step_compiles(self, state: MambaState, item_ids: Tensor) -> bool:
        """Whether ``step`` runs the numba kernels: at inference, when the scan is numba's
        (``scan: auto`` or ``numba``) and they can take the tensors."""
        tensors = (self.item_emb.weight, *state.conv, *state.ssm)
        return (
            not self.training
            and self.config.scan in ("auto", "numba")
            and numba_available()
            and item_ids.device.type == "cpu"
            and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
        )

    def _kernel_weights(self) -> _KernelWeights:
        """The compiled step's weights, rebuilt only when a parameter moved or was replaced.
        Converting them on every step would cost more than the kernels themselves."""
        if self._kernel_cache is None or not self._kernel_cache.valid():
            layers = cast(list[MambaLayer], list(self.layers))
            positions = self.pos_emb.weight if self.pos_emb is not None else None
            no_positions = self.item_emb.weight.new_empty(0, self.config.hidden_size)
            embedding = [self.item_emb.weight, positions if positions is not None else no_positions]
            embedding += [self.emb_norm.weight, self.emb_norm.bias]
            tensors = (*embedding, *(t for layer in layers for t in layer.kernel_tensors()))
            self._kernel_cache = _KernelWeights(
                registrations=_registrations,
                tensors=tensors,
                pointers=tuple(t.data_ptr() for t in tensors),
                embedding=(*numpy_views(*embedding), self.emb_norm.eps),
                layers=tuple(layer.kernel_arguments() for layer in layers),
            )
        return self._kernel_cache

    @torch.no_grad()
    def step(self, state: MambaState, item_ids: Tensor) -> tuple[MambaState, Tensor]:
        """Append one item per user, (B,) real ids -> the new state and (B, N + 1) scores.

        O(1) in the history length; equals ``init_state`` on the extended histories. At
        inference on CPU with numba (``scan: auto`` or ``numba``) it runs compiled kernels
        (``seqrec.nn.step_kernel``); otherwise PyTorch operations, the reference.
        """
        compiled = self._step_compiles(state, item_ids)
        if (item_ids.numpy() == PAD_ID).any() if compiled else bool((item_ids == PAD_ID).any()):
            raise ValueError("step needs a real item for every user, not PAD_ID")
        if self.pos_emb is not None:
            self._check_positions(int(state.length.max()))
        if compiled:
            return self._step_compiled(state, item_ids)
        x = self._embed(item_ids.unsqueeze(1), state.length.unsqueeze(1))[:, 0]  # (B, D)
        convs, ssms = [], []
        layers = cast(list[MambaLayer], list(self.layers))
        for layer, conv, ssm in zip(layers, state.conv, state.ssm, strict=True):
            x, conv, ssm = layer.step(x, conv, ssm)
            convs.append(conv)
            ssms.append(ssm)
        new_state = MambaState(tuple(convs), tuple(ssms), state.length + 1)
        return new_state, x @ self.item_emb.weight.T

    def _step_compiled(self, state: MambaState, item_ids: Tensor) -> tuple[MambaState, Tensor]:
        from seqrec.nn import step_kernel

        ids = item_ids.numpy().astype(np.int64, copy=False)
        weights = self._kernel_weights()
        x = torch.from_numpy(np.empty((ids.shape[0], self.config.hidden_size), dtype=np.float32))
        step_kernel.embed_items(*[ids, *numpy_views(state.length), *weights.embedding, x.numpy()])
        convs, ssms = [], []
        layers = cast(list[MambaLayer], list(self.layers))
        for layer, arguments, conv, ssm in zip(
            layers, weights.layers, state.conv, state.ssm, strict=True
        ):
            x, conv, ssm = _compiled_layer_step(layer, arguments, x, conv, ssm)
            convs.append(conv)
            ssms.append(ssm)
        scores = np.empty((ids.shape[0], self.item_emb.num_embeddings), dtype=np.float32)
        step_kernel.item_scores(*[x.numpy(), weights.embedding[0], scores])
        return MambaState(tuple(convs), tuple(ssms), state.length + 1), torch.from_numpy(scores)


def _compiled_layer_step(
    layer: MambaLayer, arguments: tuple[Any, ...], x: Tensor, conv: Tensor, ssm: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """``layer.step`` at inference as one call of ``seqrec.nn.step_kernel.layer_step``, with
    the layer's ``kernel_arguments``: the same values, without the dispatch cost of some
    fifty small operations."""
    from seqrec.nn import step_kernel

    A = -torch.exp(layer.mamba.A_log.detach())  # recomputed: A_log may change in place
    outputs = [np.empty(t.shape, dtype=np.float32) for t in (x, conv, ssm)]
    step_kernel.layer_step(*numpy_views(x, conv, ssm, A), *arguments, *outputs)
    out, new_conv, new_ssm = (torch.from_numpy(array) for array in outputs)
    return out, new_conv, new_ssm
