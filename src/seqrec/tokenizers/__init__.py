"""Semantic-ID item tokenisers: item embeddings -> residual quantisation -> unique code paths.

Fitting them on a dataset is the training layer's job
(``seqrec.training.semantic_ids.fit_semantic_ids``); ``SemanticIds.load(dir)`` reads a saved
artifact (``seqrec tokenize --out DIR`` writes one).
"""

from seqrec.tokenizers.rqkmeans import RQKMeans
from seqrec.tokenizers.rqvae import RQVAE, RQVAEConfig
from seqrec.tokenizers.semantic_ids import (
    TOKENIZER_FILE,
    SemanticIds,
    Tokenizer,
    build_tokenizer,
    disambiguate,
    format_report,
    load_tokenizer,
    make_semantic_ids,
)

__all__ = [
    "RQVAE",
    "TOKENIZER_FILE",
    "RQKMeans",
    "RQVAEConfig",
    "SemanticIds",
    "Tokenizer",
    "build_tokenizer",
    "disambiguate",
    "format_report",
    "load_tokenizer",
    "make_semantic_ids",
    "text_embeddings",
]
