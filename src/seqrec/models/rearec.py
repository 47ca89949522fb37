"""ReaRec: Think Before Recommend: Unleashing the Latent Reasoning Power for Sequential
Recommendation (Tang et al., 2025), the Ensemble Reasoning Learning (ERL) variant.

Paper: https://arxiv.org/abs/2503.22675 - reference code: github.com/TangJiakai/ReaRec
(``src/models/ERL.py`` and its ``ReaRecAutoRegressiveWrapper``).

After the backbone (SASRec) has encoded a history, its last hidden state h_0 is fed back
as a new token, h_0 + RPE_1 (a reasoning position embedding that separates reasoning
steps from item positions); the same blocks, reading the history and the earlier
reasoning tokens causally, produce h_1; and so on for K steps. ERL ensembles the K + 1
states: the user vector is their mean, trained with full softmax cross-entropy, and a KL
term pushes the steps' item distributions apart,
    L = CE(mean_k h_k / tau) - lambda_KL * mean_{i != j} KL(p_j || sg(p_i)).
It cannot run more reasoning steps than it has position embeddings (``depth`` <= K).

Differences from the reference implementation, all deliberate:
- The backbone is this library's SASRec with all its switches (the shipped configs use the
  SASRec+ block); reasoning tokens pass the same embedding dropout as items.
- Every position of a training row is an example with its own K reasoning tokens (the
  reference trains one example per prefix). The tokens of all positions run in one pass
  whose mask lets token (k, t) read the items up to t and the tokens (k' <= k, t).
- No KV cache: each step re-encodes the history with the new tokens appended. The result
  is the same in eval mode; in training the history's dropout masks differ between steps.
- The KL term is computed in chunks of positions with activation checkpointing, so the
  (positions, K + 1, N) distributions are never all in memory.
- The temperature tau defaults to 1.0, where the reference uses 0.07 (``temperature``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from seqrec.batch import PAD_ID, ModelOutput, SeqBatch
from seqrec.config import ConfigError, check_float
from seqrec.losses import fused_full_ce
from seqrec.models.backbone_options import backbone_config
from seqrec.models.base import ModelConfig, ScoringRecommender, register_model
from seqrec.models.sasrec import SASRec, SASRecConfig
from seqrec.nn.masks import attention_mask


@dataclass(frozen=True, kw_only=True)
class ReaRecConfig(ModelConfig):
    name: ClassVar[str] = "rearec"
    inference_settings: ClassVar[tuple[str, ...]] = ("depth",)
    hidden_size: int = 64  # d of the SASRec backbone
    num_layers: int = 2
    num_heads: int = 1
    dropout: float = 0.2
    backbone_options: dict[str, Any] = field(default_factory=dict)  # other SASRec fields
    reasoning_steps: int = 2  # K, the reference's default reason_step
    kl_weight: float = 0.05  # lambda_KL of the reasoning-diversity term (reference default)
    temperature: float = 1.0  # tau; the reference uses 0.07 with N(0, 0.02) embeddings
    depth: int | None = None  # reasoning steps at inference (<= K); None = K

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.reasoning_steps < 0:
            raise ConfigError(f"model.reasoning_steps must be >= 0, got {self.reasoning_steps}")
        if self.depth is not None and not 0 <= self.depth <= self.reasoning_steps:
            raise ConfigError(
                f"model.depth must be in 0..{self.reasoning_steps} (ReaRec has one reasoning "
                f"position embedding per trained step), got {self.depth}"
            )
        check_float("model.dropout", self.dropout, at_least=0.0, below=1.0)
        check_float("model.kl_weight", self.kl_weight, at_least=0.0)
        check_float("model.temperature", self.temperature, above=0.0)
        self.backbone_config()

    @property
    def inference_depth(self) -> int:
        return self.reasoning_steps if self.depth is None else self.depth

    def backbone_config(self) -> SASRecConfig:
        config = backbone_config(SASRecConfig, self, self.backbone_options)
        if config.user_embedding:
            raise ConfigError(
                "model.backbone_options.user_embedding: ReaRec does not use a user embedding"
            )
        if config.layout == "post_ln":
            raise ConfigError(
                "model.backbone_options.layout: ReaRec's backbone cannot use layout: post_ln "
                "(its reasoning tokens would skip the input LayerNorm)"
            )
        return config

    @property
    def loss_splits_by_rows(self) -> bool:
        return True  # CE and the steps' KL at every position, each of its own row


def reasoning_mask(real: Tensor, positions: Tensor, steps: int) -> Tensor:
    """(B, L) real items, (G,) positions with reasoning tokens -> (B, 1, T, T) bool mask,
    T = L + steps * G: items attend causally among items; token (k, g) reads the real items
    up to positions[g] and the tokens (k' <= k, g). Tokens are ordered step-major."""
    B, L = real.shape
    G = positions.numel()
    device = real.device
    items = attention_mask(real, causal=True)  # (B, 1, L, L)
    if steps == 0:
        return items
    n = steps * G
    before = torch.arange(L, device=device).unsqueeze(0) <= positions.unsqueeze(1)  # (G, L)
    reads_items = (real.unsqueeze(1) & before).repeat(1, steps, 1)  # (B, n, L)
    step = torch.arange(n, device=device) // G
    group = torch.arange(n, device=device) % G
    reads_tokens = (group[:, None] == group[None, :]) & (step[None, :] <= step[:, None])
    top = torch.cat([items, items.new_zeros(B, 1, L, n)], dim=3)
    bottom = torch.cat(
        [reads_items.unsqueeze(1), reads_tokens.expand(B, 1, n, n)], dim=3
    )  # (B, 1, n, T)
    return torch.cat([top, bottom], dim=2)


def kl_diversity(states: Tensor, items: Tensor, temperature: float, chunk: int = 256) -> Tensor:
    """ERL's regulariser: mean over positions and ordered step pairs i != j of
    KL(p_j || sg(p_i)), p_k = softmax(h_k . E / tau) over items 1..N. states: (P, T, D).

    Chunks of positions are checkpointed, so the (P, T, N) distributions are never stored.
    """
    P, T, _ = states.shape
    if T < 2:
        return states.new_zeros(())
    catalogue = items[1:]

    def chunk_sum(h: Tensor, e: Tensor) -> Tensor:
        logits = h @ e.T / temperature  # (c, T, N)
        log_p = logits.log_softmax(dim=-1)
        p = log_p.exp()
        own = (p * log_p).sum(dim=-1)  # (c, T): sum_v p_j log p_j
        cross = p @ log_p.detach().transpose(1, 2)  # (c, T, T): [j, i] = sum_v p_j log sg(p_i)
        kl = own.unsqueeze(2) - cross  # KL(p_j || sg(p_i)), zero on the diagonal
        return kl.sum() - kl.diagonal(dim1=1, dim2=2).sum()

    total = states.new_zeros(())
    for start in range(0, P, chunk):
        part = checkpoint(chunk_sum, states[start : start + chunk], catalogue, use_reentrant=False)
        total = total + part
    return total / (P * T * (T - 1))


@register_model
class ReaRec(ScoringRecommender):
    config_class = ReaRecConfig
    config: ReaRecConfig

    def __init__(self, config: ReaRecConfig) -> None:
        super().__init__(config)
        self.backbone = SASRec(config.backbone_config())
        steps = max(config.reasoning_steps, 1)  # an unused row keeps K = 0 loadable
        self.reason_pos_emb = nn.Embedding(steps, config.hidden_size)
        nn.init.xavier_normal_(self.reason_pos_emb.weight)
        if config.reasoning_steps == 0:
            self.reason_pos_emb.weight.requires_grad_(False)

    def _blocks(self, x: Tensor, mask: Tensor) -> Tensor:
        for block in self.backbone.blocks:
            x, _ = block(x, mask)
        return self.backbone.ln_f(x)

    def reasoning_states(self, input_ids: Tensor, steps: int, newest_only: bool) -> Tensor:
        """(B, L) histories -> (B, G, steps + 1, D): h_0 (the backbone's state) and the states
        of ``steps`` reasoning tokens, at every position (G = L) or the newest (G = 1)."""
        input_ids = input_ids[:, -self.config.max_seq_len :]
        L = input_ids.size(1)
        real = input_ids != PAD_ID
        x = self.backbone.embed(input_ids)  # (B, L, D), as SASRec.encode builds it
        positions = torch.arange(L - 1 if newest_only else 0, L, device=x.device)  # (G,)
        G = positions.numel()
        states = [self._blocks(x, reasoning_mask(real, positions, 0))[:, positions]]
        tokens: list[Tensor] = []
        for k in range(steps):
            # r_k = h_{k-1} + RPE_k, appended after the history (and the earlier tokens)
            tokens.append(self.backbone.emb_dropout(states[-1] + self.reason_pos_emb.weight[k]))
            out = self._blocks(
                torch.cat([x, *tokens], dim=1), reasoning_mask(real, positions, k + 1)
            )
            states.append(out[:, -G:])  # (B, G, D)
        return torch.stack(states, dim=2)

    def forward(self, batch: SeqBatch) -> ModelOutput:
        if batch.labels is None:
            raise ValueError("ReaRec.forward needs batch.labels")
        states = self.reasoning_states(
            batch.input_ids, self.config.reasoning_steps, newest_only=False
        )
        labels = batch.labels[:, -states.size(1) :]
        real = labels != PAD_ID
        chosen = states[real]  # (P, K + 1, D)
        items = self.backbone.output_embedding()
        tau = self.config.temperature
        next_item = fused_full_ce(chosen.mean(dim=1) / tau, items, labels[real])
        if self.config.kl_weight == 0:
            return ModelOutput(loss=next_item)
        diversity = kl_diversity(chosen, items, tau)
        return ModelOutput(
            loss=next_item - self.config.kl_weight * diversity,
            terms={"next_item": next_item, "kl_diversity": diversity},
        )

    def score(self, input_ids: Tensor, users: Tensor | None = None) -> Tensor:
        states = self.reasoning_states(input_ids, self.config.inference_depth, newest_only=True)
        user = states[:, 0].mean(dim=1)  # (B, D): the ensemble of the reasoning states
        return user @ self.backbone.output_embedding().T / self.config.temperature

    def scores_at_depths(self, input_ids: Tensor, max_depth: int) -> Iterator[Tensor]:
        """``score`` at depths 0..max_depth from one pass: max_depth + 1 (B, N + 1) tensors,
        each computed when the previous one has been consumed. (The reasoning tokens are
        causal, so depth d's states are the first d + 1 of any deeper run's.)"""
        states = self.reasoning_states(input_ids, max_depth, newest_only=True)[:, 0]
        ensembles = states.cumsum(dim=1) / torch.arange(
            1, max_depth + 2, device=states.device, dtype=states.dtype
        ).unsqueeze(1)  # (B, max_depth + 1, D): the mean of states 0..d
        items = self.backbone.output_embedding().T / self.config.temperature
        for depth in range(max_depth + 1):
            yield ensembles[:, depth] @ items
