"""TIGER: Recommender Systems with Generative Retrieval (Rajput et al., NeurIPS 2023).

Paper: https://arxiv.org/abs/2305.05065 - no official code; reimplementations compared in
``../shared/docs/anchors.md`` §5 (EdoardoBotta/RQ-VAE-Recommender, phonism/genrec, cornac).

Every item is a semantic ID: a path of M codes (RQ-VAE levels plus one disambiguation level,
``seqrec.tokenizers``). The history's items are flattened into their code tokens, prefixed by
a hashed user token, and read by a T5-style encoder; a T5-style decoder generates the next
item's M codes one level at a time, trained with teacher forcing. Recommendation is beam
search constrained to the trie of the catalogue's code paths (``seqrec.nn.beam_search``), so
every recommendation is a real item, and the beam's paths are the ranked list.

TrieRec (``trierec``, Xu et al. 2026) is this model with its two trie-aware positional
encodings switched on (``tae``, ``tre``; ``seqrec.nn.trie_encodings``).

Sizes default to the paper's: 4 encoder and 4 decoder layers, model size 128, 6 heads of 64,
feed-forward 1024, dropout 0.1, 2000 user buckets, beam 10, the last 20 items of a history.

Differences from the paper, all deliberate:
- Each level's code is predicted by a softmax over that level's codes only (the output
  embedding is the input embedding of those codes, T5's tying with its d^-1/2 scale); T5 over
  one shared vocabulary normalises over every token, most of which are invalid at the level.
- Training examples are every position of every training sequence with the (up to
  max_seq_len) items before it; the paper does not say how it samples them.
- Attention logits are scaled by 1/sqrt(head size) (``seqrec.nn.t5``).
- The user token is ``user index mod user_buckets`` (the paper hashes raw user ids); a
  history served without a user gets the mean of the user tokens' embeddings (until
  2026-12-08 an "unknown user" token that training never saw). It sits right before
  the history's first item, after the left padding, so that a history encodes the same
  however wide its batch pads (until 2026-12-07 it sat before the padding).
- Optimisation (the paper's inverse-square-root schedule from lr 0.01, 200k steps of 256)
  is the trainer's business; the configs say what they use.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqrec.batch import PAD_ID, BatchNeeds, ModelOutput, SeqBatch
from seqrec.config import ConfigError, check_float
from seqrec.models.base import ModelConfig, SequentialRecommender, register_model
from seqrec.nn.beam_search import DictTrie, constrained_beam_search, reference_beam_search
from seqrec.nn.code_trie import CodeTrie
from seqrec.nn.t5 import DecoderLayer, EncoderLayer, RelativePositionBias
from seqrec.nn.trie_encodings import (
    TAEVariant,
    TREVariant,
    TrieAbsoluteEncoding,
    TrieRelativeBias,
)

BOS_ID = 1  # the decoder's start token; 0 is padding, codes start at 2


@dataclass(frozen=True, kw_only=True)
class TIGERConfig(ModelConfig):
    name: ClassVar[str] = "tiger"
    at_least_one: ClassVar[tuple[str, ...]] = (
        "num_heads",
        "num_encoder_layers",
        "num_decoder_layers",
        "beam_size",
        "relative_buckets",
    )
    inference_settings: ClassVar[tuple[str, ...]] = ("beam_size",)
    served_limits: ClassVar[Mapping[str, int]] = {"beam_size": 1000}  # the served k's limit
    uses_semantic_ids: ClassVar[bool] = True
    max_seq_len: int = 20  # history items read (the TIGER/TrieRec protocol's last 20)
    # Codes per level of the semantic IDs, disambiguation level included. Training fills it
    # in from the tokenizer section; set it only to build a model by hand.
    codebook_sizes: tuple[int, ...] = ()
    hidden_size: int = 128
    num_heads: int = 6
    head_size: int = 64  # T5's d_kv; attention's inner size is num_heads * head_size
    ffn_size: int = 1024
    num_encoder_layers: int = 4
    num_decoder_layers: int = 4
    dropout: float = 0.1
    user_buckets: int = 2000  # hashed user tokens prefixed to the history; 0 = none
    relative_buckets: int = 32  # T5 relative position bias
    relative_max_distance: int = 128
    beam_size: int = 10  # constrained beam width (at least the k asked for)
    tae: TAEVariant = "none"  # TrieRec's trie-aware absolute encoding
    tre: TREVariant = "none"  # TrieRec's topology-aware relative encoding

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.codebook_sizes and min(self.codebook_sizes) < 1:
            raise ConfigError(f"model.codebook_sizes must be positive, got {self.codebook_sizes}")
        check_float("model.dropout", self.dropout, at_least=0.0, below=1.0)
        # T5's buckets: the encoder's half of relative_buckets must hold an exact bucket,
        # and the logarithmic ones need max_distance beyond the decoder's exact range.
        if self.relative_buckets < 4 or self.relative_max_distance <= self.relative_buckets // 2:
            raise ConfigError(
                "model.relative_buckets must be >= 4 and relative_max_distance > "
                f"relative_buckets // 2, got {self.relative_buckets} and "
                f"{self.relative_max_distance}"
            )

    @property
    def batch_needs(self) -> BatchNeeds:
        return BatchNeeds(prefix_examples=True)

    @property
    def loss_splits_by_rows(self) -> bool:
        return True  # the mean over examples (rows) of each one's code cross-entropy


def sequential_codes(num_items: int, codebook_sizes: tuple[int, ...]) -> Tensor:
    """(N + 1, M) item i's index i - 1 written in the mixed radix ``codebook_sizes`` (row 0,
    padding, is -1): unique placeholder paths until the tokenizer's codes are loaded."""
    capacity = math.prod(codebook_sizes)
    if capacity < num_items:
        raise ConfigError(
            f"model.codebook_sizes {codebook_sizes} give {capacity} code paths "
            f"for {num_items} items"
        )
    codes = torch.full((num_items + 1, len(codebook_sizes)), -1, dtype=torch.long)
    rest = torch.arange(num_items)
    for level in reversed(range(len(codebook_sizes))):
        codes[1:, level] = rest % codebook_sizes[level]
        rest = rest // codebook_sizes[level]
    return codes


@register_model
class TIGER(SequentialRecommender):
    config_class = TIGERConfig
    config: TIGERConfig
    item_codes: Tensor  # (N + 1, M) buffer: the semantic IDs, saved with the weights
    level_offsets: Tensor  # (M,) ``offsets`` as a buffer on the model's device

    def __init__(self, config: TIGERConfig) -> None:
        super().__init__(config)
        if not config.codebook_sizes:
            raise ConfigError(
                f"model.codebook_sizes is empty: {config.name} needs semantic IDs; `seqrec "
                "train` fits them from the tokenizer section and fills it in"
            )
        c, sizes = config, config.codebook_sizes
        self.num_levels = len(sizes)
        self.vocab_size = max(sizes)  # V: the width of a level's log-probabilities
        # Token ids: 0 padding, 1 BOS, then each level's codes, then the user tokens.
        self.offsets = [2 + sum(sizes[:level]) for level in range(self.num_levels)]
        self.register_buffer("level_offsets", torch.tensor(self.offsets), persistent=False)
        self.user_offset = 2 + sum(sizes)
        vocab = self.user_offset + (c.user_buckets + 1 if c.user_buckets else 0)
        self.embedding = nn.Embedding(vocab, c.hidden_size, padding_idx=PAD_ID)
        self.register_buffer("item_codes", sequential_codes(c.num_items, sizes))
        self.dropout = nn.Dropout(c.dropout)
        layer = (c.hidden_size, c.num_heads, c.head_size, c.ffn_size, c.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(*layer) for _ in range(c.num_encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(*layer) for _ in range(c.num_decoder_layers))
        self.encoder_norm = nn.RMSNorm(c.hidden_size, eps=1e-6)
        self.decoder_norm = nn.RMSNorm(c.hidden_size, eps=1e-6)
        buckets = {"num_buckets": c.relative_buckets, "max_distance": c.relative_max_distance}
        self.encoder_positions = RelativePositionBias(c.num_heads, bidirectional=True, **buckets)
        self.decoder_positions = RelativePositionBias(c.num_heads, bidirectional=False, **buckets)
        self.tae = (
            TrieAbsoluteEncoding(self.num_levels, c.hidden_size, c.tae) if c.tae != "none" else None
        )
        self.tre = TrieRelativeBias(self.num_levels, c.tre) if c.tre != "none" else None
        self.apply(self._init_weights)
        self._trie: tuple[tuple[int, int, torch.device], CodeTrie] | None = None

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding) and module.padding_idx == PAD_ID:
            nn.init.normal_(module.weight, std=module.embedding_dim**-0.5)
            with torch.no_grad():
                module.weight[PAD_ID].zero_()

    # --- semantic IDs -----------------------------------------------------------------------

    def set_semantic_ids(self, codes: Tensor) -> None:
        """Use ``codes`` (N + 1, M), row i = item i's code path, as the items' semantic IDs."""
        expected = (self.config.num_items + 1, self.num_levels)
        if tuple(codes.shape) != expected:
            raise ConfigError(
                f"semantic IDs of shape {tuple(codes.shape)} do not fit this model "
                f"({expected[0] - 1} items, {expected[1]} levels)"
            )
        sizes = torch.tensor(self.config.codebook_sizes)
        if ((codes[1:] < 0) | (codes[1:] >= sizes)).any():
            raise ConfigError(f"semantic IDs outside the codebooks {self.config.codebook_sizes}")
        CodeTrie.build(codes)  # validates that every path is unique
        with torch.no_grad():
            self.item_codes.copy_(codes)

    @property
    def trie(self) -> CodeTrie:
        """The trie of the current semantic IDs on the model's device, rebuilt only when the
        codes change (``set_semantic_ids``, ``load_state_dict``) or move."""
        codes = self.item_codes
        key = (codes.data_ptr(), codes._version, codes.device)
        if self._trie is None or self._trie[0] != key:
            trie = CodeTrie.build(codes, vocab_size=self.vocab_size)  # the log-probs' width
            self._trie = (key, trie.to(codes.device))
        return self._trie[1]

    # --- encoder and decoder ----------------------------------------------------------------

    def _item_tokens(self, items: Tensor) -> tuple[Tensor, Tensor]:
        """(...,) item ids -> (..., M) their code tokens (PAD_ID for padding) and codes."""
        codes = self.item_codes[items]
        tokens = torch.where(codes >= 0, codes + self.level_offsets, PAD_ID)
        return tokens, codes

    def _user_vectors(self, users: Tensor | None, batch_size: int) -> Tensor:
        """(B, D) the users' token embeddings; without users, the mean of the trained user
        tokens (the vocabulary's "unknown user" row is never trained: every training row has
        its user, so it would condition anonymous histories on its random initial value).
        With fewer users than buckets only the first num_users buckets are ever trained."""
        buckets = self.config.user_buckets
        if users is None:
            reached = min(buckets, self.config.num_users) if self.config.num_users else buckets
            trained = self.embedding.weight[self.user_offset : self.user_offset + reached]
            return trained.mean(dim=0).expand(batch_size, -1)
        return self.embedding(self.user_offset + users.long() % buckets)

    def encode(self, input_ids: Tensor, users: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(B, L) left-padded histories -> encoder output (B, T, D) and real-token mask (B, T),
        T = L·M plus one user token; only the last max_seq_len items are read."""
        input_ids = input_ids[:, -self.config.max_seq_len :]
        B, L = input_ids.shape
        M = self.num_levels
        tokens, codes = self._item_tokens(input_ids)  # (B, L, M)
        real_items = input_ids != PAD_ID
        x = self.embedding(tokens)  # (B, L, M, D)
        if self.tae is not None:
            x = x + self.tae(x) * real_items[..., None, None]
        x = x.reshape(B, L * M, -1)
        real = real_items.repeat_interleave(M, dim=1)  # (B, L·M)
        prefix = 0
        if self.config.user_buckets:
            # The user token goes right before the history's first item, not before the
            # padding: its relative position to the items must not depend on how wide the
            # batch pads. One more slot on the left holds it when nothing is padded.
            user = self._user_vectors(users, B)  # (B, D)
            x = F.pad(x, (0, 0, 1, 0))
            real = F.pad(real, (1, 0), value=False)
            slot = (~real).sum(dim=1) - 1  # (B,) the last non-item slot
            rows = torch.arange(B, device=x.device)
            x = x.index_put((rows, slot), user)
            real = real.index_put((rows, slot), torch.ones_like(slot, dtype=torch.bool))
            prefix = 1
        T = x.size(1)
        allowed = real[:, None, :] | torch.eye(T, dtype=torch.bool, device=x.device)
        padding = torch.zeros_like(allowed, dtype=x.dtype).masked_fill(~allowed, float("-inf"))
        # Additive terms, summed by the attention a chunk at a time (seqrec.nn.attention)
        bias: tuple[Tensor, ...] = (self.encoder_positions(T, T), padding.unsqueeze(1))
        if self.tre is not None:
            bias = (*bias, self.tre(codes, real_items, prefix_tokens=prefix))
        x = self.dropout(x)
        for layer in self.encoder:
            x = layer(x, bias)
        return self.dropout(self.encoder_norm(x)), real

    def cross_keys(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Every decoder layer's cross-attention keys and values, computed once per batch."""
        layers: list[DecoderLayer] = list(self.decoder)  # type: ignore[arg-type]
        return [layer.cross_keys(memory) for layer in layers]

    def decode(
        self, paths: Tensor, cross: list[tuple[Tensor, Tensor]], memory_real: Tensor
    ) -> Tensor:
        """paths (B, b, t) codes of levels 1..t -> decoder output (B, b, t + 1, D) after
        [BOS, path]; position l predicts level l + 1."""
        B, b, t = paths.shape
        tokens = torch.cat(
            [paths.new_full((B, b, 1), BOS_ID), paths + self.level_offsets[:t]], dim=2
        )  # (B, b, t + 1)
        x = self.dropout(self.embedding(tokens))
        causal = torch.ones(t + 1, t + 1, dtype=torch.bool, device=x.device).tril()
        self_bias = self.decoder_positions(t + 1, t + 1).masked_fill(~causal, float("-inf"))
        cross_bias = torch.zeros(memory_real.shape, dtype=x.dtype, device=x.device)
        cross_bias = cross_bias.masked_fill(~memory_real, float("-inf"))[:, None, None, :]
        for layer, keys in zip(self.decoder, cross, strict=True):
            x = layer(x, self_bias, keys, cross_bias)
        return self.dropout(self.decoder_norm(x))

    def level_logits(self, hidden: Tensor, level: int) -> Tensor:
        """(..., D) decoder output -> (..., C_level) logits of level ``level``'s codes
        (0-based), with the tied output embedding."""
        start, size = self.offsets[level], self.config.codebook_sizes[level]
        weight = self.embedding.weight[start : start + size]
        return (hidden * self.config.hidden_size**-0.5) @ weight.T

    # --- training ---------------------------------------------------------------------------

    def forward(self, batch: SeqBatch) -> ModelOutput:
        """Teacher-forced cross-entropy of the next item's codes, averaged over levels."""
        if batch.labels is None:
            raise ValueError(f"{self.config.name} training needs labels")
        target = batch.labels[:, -1]
        keep = target != PAD_ID
        users = None if batch.users is None else batch.users[keep]
        memory, real = self.encode(batch.input_ids[keep], users)
        codes = self.item_codes[target[keep]]  # (B, M)
        hidden = self.decode(codes[:, None, :-1], self.cross_keys(memory), real)[:, 0]
        losses = [
            F.cross_entropy(self.level_logits(hidden[:, level], level), codes[:, level])
            for level in range(self.num_levels)
        ]
        return ModelOutput(loss=torch.stack(losses).mean())

    # --- recommendation ---------------------------------------------------------------------

    def _step_log_probs(
        self, paths: Tensor, cross: list[tuple[Tensor, Tensor]], memory_real: Tensor
    ) -> Tensor:
        """(B, b, t) -> (B, b, V) log-probabilities of level t + 1's codes (-inf past the
        level's codebook)."""
        level = paths.size(-1)
        hidden = self.decode(paths, cross, memory_real)[:, :, -1]
        log_probs = F.log_softmax(self.level_logits(hidden, level).float(), dim=-1)
        return F.pad(log_probs, (0, self.vocab_size - log_probs.size(-1)), value=float("-inf"))

    @torch.no_grad()
    def recommend(
        self, input_ids: Tensor, k: int, exclude_seen: bool = True, users: Tensor | None = None
    ) -> Tensor:
        """Trie-constrained beam search, all users and beams at once; (B, k) item ids.

        The beam is max(beam_size, k) wide. The encoder reads the last max_seq_len items;
        ``exclude_seen`` excludes every item of ``input_ids``, however long. If fewer than k
        items are valid (a tiny catalogue minus the history), the list ends in PAD_ID.
        """
        found = min(k, self.config.num_items)  # a k beyond the catalogue: PAD_ID after it
        memory, real = self.encode(input_ids, users)
        cross = self.cross_keys(memory)
        result = constrained_beam_search(
            lambda paths: self._step_log_probs(paths, cross, real),
            self.trie,
            batch_size=input_ids.size(0),
            beam_size=max(self.config.beam_size, found),
            exclude=input_ids if exclude_seen else None,
        )
        return F.pad(result.items[:, :found], (0, k - found), value=PAD_ID)

    @torch.no_grad()
    def recommend_reference(
        self, input_ids: Tensor, k: int, exclude_seen: bool = True, users: Tensor | None = None
    ) -> Tensor:
        """The same ranking, one user and one beam at a time with a dict trie, re-running the
        decoder for every beam (as peers decode): the definition the fast path is tested
        against and the baseline it is timed against."""
        found = min(k, self.config.num_items)
        trie = DictTrie(self.trie)
        out = torch.full((input_ids.size(0), k), PAD_ID, dtype=torch.long)
        for row in range(input_ids.size(0)):
            user = None if users is None else users[row : row + 1]
            memory, real = self.encode(input_ids[row : row + 1], user)
            cross = self.cross_keys(memory)

            def step(path: list[int], cross: Any = cross, real: Tensor = real) -> Tensor:
                paths = torch.tensor([[path]], dtype=torch.long, device=input_ids.device)
                return self._step_log_probs(paths.view(1, 1, -1), cross, real)[0, 0].cpu()

            seen = set(input_ids[row].tolist()) - {PAD_ID} if exclude_seen else set()
            beams = reference_beam_search(step, trie, max(self.config.beam_size, found), seen)
            items = [item for item, _ in beams[:found]]
            out[row, : len(items)] = torch.tensor(items, dtype=torch.long)
        return out.to(input_ids.device)
