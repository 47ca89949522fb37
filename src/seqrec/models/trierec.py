"""TrieRec: Trie-Aware Transformers for Generative Recommendation (Xu et al., 2026).

Paper: arXiv 2602.21677 - no public code found (``../shared/docs/anchors.md`` §5.5).

TIGER (``seqrec.models.tiger``) with the paper's two positional encodings for flattened
semantic-ID sequences (``seqrec.nn.trie_encodings``): TAE, a trie-aware absolute encoding
added to the history's token embeddings at the encoder input, and TRE, a topology-aware
relative bias B(d_LCA, δu, δv) added to every encoder attention logit. Both are on by
default; the paper's ablations are the switches ``tae: blocked | prefix | none`` and
``tre: no_lca | no_delta | none`` (``tre: none`` keeps TIGER's 1-D relative position bias,
as the paper's "w/o TRE").

Deliberate differences: TRE is applied to the encoder's self-attention, where every token's
full path is known; the decoder (which generates one item's codes) keeps TIGER's relative
position bias. The paper adds TrieRec on top of several generative recommenders; here it sits
on TIGER.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from seqrec.models.base import register_model
from seqrec.models.tiger import TIGER, TIGERConfig
from seqrec.nn.trie_encodings import TAEVariant, TREVariant


@dataclass(frozen=True, kw_only=True)
class TrieRecConfig(TIGERConfig):
    name: ClassVar[str] = "trierec"
    tae: TAEVariant = "full"
    tre: TREVariant = "full"


@register_model
class TrieRec(TIGER):
    """TIGER whose config switches the trie-aware encodings on."""

    config_class = TrieRecConfig
