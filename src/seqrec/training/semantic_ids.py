"""Semantic IDs for a training run: fitted from the tokenizer section (item embeddings ->
tokeniser -> codes -> disambiguation), loaded from another
run (``tokenizer.from_run``), or read back from the run itself when it resumes.

The run directory keeps them in ``semantic_ids/`` (codes, the fitted tokenizer and what the
fit measured); the model also holds the codes as a buffer, so a checkpoint alone serves.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seqrec.config import ConfigError, TokenizerConfig
from seqrec.data.download import sha256_file
from seqrec.data.item_text import count_duplicates, count_missing, item_texts
from seqrec.data.sequences import PreparedData
from seqrec.io import atomic_write_bytes
from seqrec.tokenizers import (
    TOKENIZER_FILE,
    SemanticIds,
    Tokenizer,
    build_tokenizer,
    format_report,
    make_semantic_ids,
)
from seqrec.training.item_embeddings import item_embeddings

logger = logging.getLogger(__name__)

SEMANTIC_IDS = "semantic_ids"  # folder of a run directory


def fit_semantic_ids(
    config: TokenizerConfig, data: PreparedData, data_dir: str | Path | None = None
) -> tuple[SemanticIds, Tokenizer]:
    """Embed the items, fit the tokeniser, encode and disambiguate."""
    if config.codebook_size > data.num_items:
        raise ConfigError(
            f"tokenizer.codebook_size {config.codebook_size} is larger than the catalogue "
            f"({data.num_items} items of {data.name}): choose codebook_size <= {data.num_items} "
            "(a code book far smaller than the catalogue, e.g. 256 for 10k items)"
        )
    start = time.perf_counter()
    text_facts: dict[str, int] = {}
    texts = None
    if config.embeddings == "text":
        texts = item_texts(data, data_dir)
        text_facts = {
            "items_without_text": count_missing(texts),
            "duplicate_texts": count_duplicates(texts),
        }
    embeddings = item_embeddings(config, data, data_dir, texts)
    embed_seconds = time.perf_counter() - start
    tokenizer = build_tokenizer(config, embeddings.shape[1])
    start = time.perf_counter()
    tokenizer.fit(embeddings)
    codes = tokenizer.transform(embeddings)
    fit_seconds = time.perf_counter() - start
    reconstruction = tokenizer.decode(codes)
    ids = make_semantic_ids(
        codes,
        config.codebook_size,
        data.id_map.items,
        config.method,
        dataset=data.name,
        embedding_dim=int(embeddings.shape[1]),
        embed_seconds=round(embed_seconds, 3),
        fit_seconds=round(fit_seconds, 3),
        reconstruction_mse=float(np.mean((reconstruction - embeddings) ** 2)),
        embedding_variance=float(embeddings.var(axis=0).sum() / embeddings.shape[1]),
        **text_facts,
        config=dataclasses.asdict(config),
    )
    return ids, tokenizer


def semantic_ids_folder(path: str | Path) -> Path:
    """A run directory's ``semantic_ids/`` folder, or ``path`` itself when it is one (the
    output of ``seqrec tokenize --out``)."""
    path = Path(path)
    return path / SEMANTIC_IDS if (path / SEMANTIC_IDS).is_dir() else path


@dataclass(frozen=True)
class RunSemanticIds:
    ids: SemanticIds
    tokenizer: Tokenizer | None  # fitted for this run (None when loaded)
    loaded_from: Path | None  # the folder they were read from

    def save(self, run_dir: Path) -> None:
        """Write them to ``run_dir/semantic_ids`` (with the tokenizer, when there is one)."""
        folder = run_dir / SEMANTIC_IDS
        if self.loaded_from is not None and self.loaded_from.resolve() == folder.resolve():
            return
        self.save_to(folder)

    def save_to(self, folder: Path) -> None:
        """Write the tokenizer (when there is one) and the IDs into ``folder``, each file
        atomically. The IDs' metadata goes last and records the sha256 of their codes and of
        the tokenizer, so a rewrite cut short loads as damaged, never as a mix of old and new
        files (``SemanticIds.load``, ``load_tokenizer``)."""
        target = folder / TOKENIZER_FILE
        digest = None
        if self.tokenizer is not None:
            self.tokenizer.save(target)
            digest = sha256_file(target)
        elif self.loaded_from is not None and (self.loaded_from / TOKENIZER_FILE).is_file():
            atomic_write_bytes(target, (self.loaded_from / TOKENIZER_FILE).read_bytes())
            digest = sha256_file(target)
        self.ids.save(folder, tokenizer_sha256=digest)


def semantic_ids_for_run(
    config: TokenizerConfig,
    data: PreparedData,
    data_dir: str | Path | None,
    run_dir: Path,
    resume: bool,
) -> RunSemanticIds:
    """The run's semantic IDs, checked against the data's items: its own when it resumes,
    another run's (``tokenizer.from_run``), or fitted here."""
    saved = run_dir / SEMANTIC_IDS
    if resume and saved.is_dir():
        found = RunSemanticIds(SemanticIds.load(saved), None, saved)
    elif config.from_run is not None:
        folder = semantic_ids_folder(config.from_run)
        found = RunSemanticIds(SemanticIds.load(folder), None, folder)
        logger.info("semantic IDs from %s", folder)
    else:
        ids, tokenizer = fit_semantic_ids(config, data, data_dir)
        logger.info("semantic IDs (%s):\n%s", config.method, format_report(ids.report()))
        found = RunSemanticIds(ids, tokenizer, None)
    found.ids.check_matches(data.id_map.items)
    return found
