"""TrieRec's positional encodings for flattened semantic-ID sequences (Xu et al., 2026).

TAE (trie-aware absolute encoding) tells each history token where it sits in the trie:
    x_con_i = [e_i1; ...; e_iM]                        (M·d)
    x_hat_i = LayerNorm(W2 GELU(W1 x_con_i))           (2 layers; cross-token and
                                                        cross-dimension interaction)
    p_il    = P_l x_hat_i + b_l                        (one projector per depth l)
and e_il + p_il replaces the token embedding at the encoder input (history tokens only: the
item being generated has no full path yet).

TRE (topology-aware relative encoding) adds a learned scalar B(d_LCA, δu, δv) to the
attention logit of every token pair, where d_LCA is the depth of the pair's lowest common
ancestor in the trie and δ the depth of each token below it. One table serves every layer; the
bias is computed once per sequence.

Ablations (spec "Experiments"): TAE-Blocked mixes each embedding dimension only across the
path's depths (a token-mixing MLP shared by all dimensions: no cross-dimension mixing);
TAE-Prefix replaces the MLP by the prefix sum of the path's embeddings, p_il =
P_l(e_i1 + ... + e_il) + b_l; TRE without LCA indexes by (δu, δv) only, TRE without δ by
d_LCA only.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

TAEVariant = Literal["full", "blocked", "prefix", "none"]
TREVariant = Literal["full", "no_lca", "no_delta", "none"]


class TrieAbsoluteEncoding(nn.Module):
    """(B, L, M, d) embeddings of the history items' path tokens -> (B, L, M, d) additions."""

    def __init__(self, num_levels: int, hidden_size: int, variant: TAEVariant) -> None:
        super().__init__()
        if variant == "none":
            raise ValueError("TrieAbsoluteEncoding needs a variant other than 'none'")
        self.variant = variant
        M, d = num_levels, hidden_size
        if variant == "full":
            self.mix_in = nn.Linear(M * d, M * d)
            self.mix_out = nn.Linear(M * d, M * d)
        elif variant == "blocked":  # mixes depths, per dimension, weights shared by dimensions
            self.mix_in = nn.Linear(M, M)
            self.mix_out = nn.Linear(M, M)
        if variant in ("full", "blocked"):
            self.norm = nn.LayerNorm(M * d)
            self.project = nn.Linear(M * d, M * d)  # the M projectors P_l: (M·d) -> d, stacked
        else:  # prefix: one d -> d projector per depth
            self.project_weight = nn.Parameter(torch.empty(M, d, d))
            self.project_bias = nn.Parameter(torch.zeros(M, d))
            nn.init.xavier_uniform_(self.project_weight)

    def forward(self, path_embeddings: Tensor) -> Tensor:
        B, L, M, d = path_embeddings.shape
        if self.variant == "prefix":
            prefix = path_embeddings.cumsum(dim=2)
            return torch.einsum("blmd,med->blme", prefix, self.project_weight) + self.project_bias
        if self.variant == "full":
            mixed = self.mix_out(F.gelu(self.mix_in(path_embeddings.reshape(B, L, M * d))))
        else:
            by_dim = path_embeddings.transpose(2, 3)  # (B, L, d, M)
            mixed = self.mix_out(F.gelu(self.mix_in(by_dim))).transpose(2, 3).reshape(B, L, M * d)
        return self.project(self.norm(mixed)).view(B, L, M, d)


class TrieRelativeBias(nn.Module):
    """A scalar table B(d_LCA, δu, δv), shared by every encoder layer and head."""

    def __init__(self, num_levels: int, variant: TREVariant) -> None:
        super().__init__()
        if variant == "none":
            raise ValueError("TrieRelativeBias needs a variant other than 'none'")
        self.variant = variant
        self.size = num_levels + 1  # depths 0..M
        # One more entry for pairs that involve a token outside the trie (the user token).
        self.table = nn.Embedding(self.size**3 + 1, 1)
        nn.init.zeros_(self.table.weight)

    def pair_table(self, num_levels: int, device: torch.device) -> Tensor:
        """(M + 1, M, M) table index of a token pair at depths (a, b) whose items share a
        prefix of c codes: d_LCA = min(a, b, c), δu = a - d_LCA, δv = b - d_LCA."""
        common = torch.arange(num_levels + 1, device=device).view(-1, 1, 1)
        depth = torch.arange(1, num_levels + 1, device=device)
        du, dv = depth.view(1, -1, 1), depth.view(1, 1, -1)
        lca = torch.minimum(torch.minimum(du, dv), common)
        delta_u, delta_v = du - lca, dv - lca
        if self.variant == "no_lca":
            lca = torch.zeros_like(lca)
        elif self.variant == "no_delta":
            delta_u, delta_v = torch.zeros_like(delta_u), torch.zeros_like(delta_v)
        n = self.size
        return (lca * n + delta_u) * n + delta_v

    @staticmethod
    def shared_prefix(codes: Tensor) -> Tensor:
        """codes (B, L, M) -> (B, L, L) how many leading codes each pair of items shares."""
        same = (codes[:, :, None, :] == codes[:, None, :, :]).long()
        return same.cumprod(dim=-1).sum(dim=-1)

    def _per_token(self, per_pair: Tensor, real: Tensor, outside: Tensor) -> Tensor:
        """(B, L, L, M, M) values per (item pair, depth pair) -> (B, L·M, L·M) per token pair,
        ``outside`` where either item is padding."""
        B, L, _, M, _ = per_pair.shape
        pair_real = (real[:, :, None] & real[:, None, :])[..., None, None]
        values = torch.where(pair_real, per_pair, outside)
        return values.permute(0, 1, 3, 2, 4).reshape(B, L * M, L * M)

    def index(self, codes: Tensor, real: Tensor) -> Tensor:
        """codes (B, L, M) paths of the history items, real (B, L) -> (B, L·M, L·M) table
        indices for every pair of path tokens (token (i, l) at flat position i·M + l)."""
        table = self.pair_table(codes.size(-1), codes.device)
        per_pair = table[self.shared_prefix(codes)]  # (B, L, L, M, M)
        return self._per_token(per_pair, real, torch.tensor(self.size**3, device=codes.device))

    def forward(self, codes: Tensor, real: Tensor, prefix_tokens: int = 0) -> Tensor:
        """-> (B, 1, T, T) logit bias with T = prefix_tokens + L·M; pairs that involve one of
        the ``prefix_tokens`` leading non-item tokens (the user token) share one entry.

        Equal to ``table[index(codes, real)]``, computed through the (M + 1, M, M) values
        per shared-prefix length, so the lookup and its gradient touch a small table, not
        every token pair.
        """
        weights = self.table.weight.squeeze(-1)
        small = weights[self.pair_table(codes.size(-1), codes.device)]  # (M + 1, M, M)
        outside = weights[self.size**3]
        bias = self._per_token(small[self.shared_prefix(codes)], real, outside)
        if prefix_tokens:
            bias = F.pad(bias - outside, (prefix_tokens, 0, prefix_tokens, 0)) + outside
        return bias.unsqueeze(1)
