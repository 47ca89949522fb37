"""Recommendations from a trained run directory: original ids in, original ids and scores out."""

from __future__ import annotations

import operator
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from seqrec.batch import PAD_ID
from seqrec.data.idmap import IdMap
from seqrec.models.base import (
    ModelConfig,
    ScoringRecommender,
    SequentialRecommender,
    check_output_shape,
    top_items_of,
    with_inference_settings,
)
from seqrec.training.checkpoint import load_run


@dataclass(frozen=True)
class Recommendation:
    """Top items for one history; ``unknown`` lists history ids the model has never seen."""

    items: list[str]
    scores: list[float] | None
    unknown: list[str] = field(default_factory=list)
    error: str | None = None  # set when nothing could be recommended (e.g. empty history)


def check_serves_histories(model: SequentialRecommender) -> None:
    """Refuse a model that scores training users by their learned embedding: it has nothing
    for a history it was not trained on."""
    if model.uses_users:
        raise ValueError(
            f"{model.config.name} scores each training user by the embedding it learned for "
            "them (a user embedding), so it cannot rank a given history: evaluate it with "
            "seqrec evaluate, and recommend or serve with a model without one (sasrec, "
            "gru4rec, mamba4rec, ...; for sasrec, gsasrec and caser: model.user_embedding: "
            "false)"
        )


class Predictor:
    """Loads a model once and answers batches of histories; safe to call from several threads
    (one call runs at a time)."""

    def __init__(
        self, model: SequentialRecommender, id_map: IdMap, device: str | torch.device = "cpu"
    ) -> None:
        self.device = torch.device(device)
        model.config.check_runnable(self.device.type)  # a kernel for another device
        self.model = model.to(device).eval()
        self.id_map = id_map
        self.max_seq_len = int(model.config.max_seq_len)
        self._lock = threading.Lock()
        self._config = model.config  # the loaded settings; a call's settings replace them

    @classmethod
    def from_run_dir(
        cls, path: str | Path, device: str = "cpu", settings: Mapping[str, Any] | None = None
    ) -> Predictor:
        """``settings``: inference settings of the model (``{"depth": 4}`` for RecRec)."""
        run = load_run(path, settings=settings)
        return cls(run.model, run.id_map, device)

    def _encode(
        self, histories: Sequence[Sequence[str]]
    ) -> tuple[list[npt.NDArray[np.int64]], list[list[str]]]:
        known, unknown = [], []
        for history in histories:
            ids, missing = self.id_map.item_to_internal([str(item) for item in history])
            known.append(ids)
            unknown.append(missing)
        return known, unknown

    @contextmanager
    def exclusive(self) -> Iterator[SequentialRecommender]:
        """The model, with no other call of this predictor running meanwhile."""
        with self._lock:
            yield self.model

    @property
    def inference_settings(self) -> tuple[str, ...]:
        """The model settings a call may change (``recommend(settings=...)``)."""
        return type(self._config).inference_settings

    @contextmanager
    def _configured(self, config: ModelConfig) -> Iterator[None]:
        """The model with ``config`` for the duration of one call (under the lock)."""
        self.model.config = config
        try:
            yield
        finally:
            self.model.config = self._config

    @torch.inference_mode()
    def recommend(
        self,
        histories: Sequence[Sequence[str]],
        k: int = 10,
        exclude_seen: bool = True,
        settings: Mapping[str, Any] | None = None,
    ) -> list[Recommendation]:
        """One ``Recommendation`` per history, in order; a bad history gets ``error``.

        The model reads the last ``max_seq_len`` known items; ``exclude_seen`` removes every
        known item of the history, however long. ``settings`` change inference settings of
        the model for this call only (``{"depth": 2}`` for RecRec).
        """
        k = check_k(k)
        check_exclude_seen(exclude_seen)
        check_serves_histories(self.model)
        histories = list(histories)  # str is refused below, not split into characters
        for history in histories:
            check_history(history)
        # ConfigError; the loaded config itself was checked for the device in __init__
        config = with_inference_settings(self._config, settings or {}, self.device.type)
        known, unknown = self._encode(histories)
        results: list[Recommendation] = []
        rows = [i for i, ids in enumerate(known) if len(ids) > 0]
        answers: dict[int, tuple[list[int], list[float] | None]] = {}
        if rows:
            with self._lock, self._configured(config):
                top = self._top([known[i] for i in rows], k, exclude_seen)
            answers = dict(zip(rows, top, strict=True))
        for i, ids in enumerate(known):
            if len(ids) == 0:
                results.append(nothing_known(unknown[i]))
                continue
            items, scores = answers[i]
            results.append(Recommendation(self.id_map.item_to_original(items), scores, unknown[i]))
        return results

    def _top(
        self, histories: list[npt.NDArray[np.int64]], k: int, exclude_seen: bool
    ) -> list[tuple[list[int], list[float] | None]]:
        """Top-k internal ids (and scores) per non-empty history."""
        width = max(len(h) for h in histories)
        if isinstance(self.model, ScoringRecommender):
            width = min(width, self.max_seq_len)
        # else: a top-k model reads the last max_seq_len items itself and excludes them all
        input_ids = torch.full((len(histories), width), PAD_ID, dtype=torch.long)
        for row, ids in enumerate(histories):
            recent = torch.from_numpy(ids[-width:])
            input_ids[row, width - len(recent) :] = recent
        input_ids = input_ids.to(self.device)
        rows, model = len(histories), self.model
        if not isinstance(model, ScoringRecommender):
            top = top_items_of(model, input_ids, k, exclude_seen).cpu()
            return [([i for i in row.tolist() if i != PAD_ID], None) for row in top]
        scores = model.score(input_ids).float().cpu()
        check_output_shape(model, "score", scores, (rows, model.config.num_items + 1), "(B, N + 1)")
        return top_items(scores, histories if exclude_seen else None, k)


def check_k(k: int) -> int:
    """``k`` as an int: any integer but a bool (a numpy one too), at least 1."""
    if isinstance(k, (bool, np.bool_)):
        raise TypeError(f"k must be an int, got {k!r}")
    try:
        k = operator.index(k)
    except TypeError:
        raise TypeError(f"k must be an int, got {k!r}") from None
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return k


def check_exclude_seen(exclude_seen: bool) -> None:
    """A bool (a numpy one too): "no" or 0 would be read as their truth value."""
    if not isinstance(exclude_seen, (bool, np.bool_)):
        raise TypeError(f"exclude_seen must be True or False, got {exclude_seen!r}")


def check_history(history: object) -> None:
    """A history is a list, tuple or numpy array of item ids: a string or bytes would be read
    one character at a time, a set has no order."""
    if not isinstance(history, (list, tuple, np.ndarray)):
        raise TypeError(
            "a history must be a list of item ids, oldest first (recommend([['1193', '661']]), "
            f"start('u1', ['1193', '661'])), not {type(history).__name__} {history!r:.60}"
        )


def nothing_known(unknown: list[str]) -> Recommendation:
    """The answer to a history without a known item: empty, or only unknown ids."""
    reason = "empty history" if not unknown else "no known item in the history"
    return Recommendation([], None, unknown, reason)


def top_items(
    scores: Tensor, seen: Sequence[npt.NDArray[np.int64]] | None, k: int
) -> list[tuple[list[int], list[float] | None]]:
    """(B, N + 1) scores (changed in place) -> per row the top-k internal ids and scores,
    never PAD_ID nor, given ``seen`` (one array per row), an item seen; fewer than k when
    fewer remain. A NaN score is an error, not an item left out."""
    if scores.isnan().any():
        raise ValueError(
            "the model scored items NaN (its weights or a sum overflowed): it cannot rank them"
        )
    scores[:, PAD_ID] = float("-inf")
    if seen is not None:
        rows = np.repeat(np.arange(len(seen)), [len(ids) for ids in seen])
        scores[torch.from_numpy(rows), torch.from_numpy(np.concatenate(seen))] = float("-inf")
    top_values, top_indices = scores.topk(min(k, scores.size(1) - 1), dim=1)
    answers: list[tuple[list[int], list[float] | None]] = []
    for values, indices in zip(top_values, top_indices, strict=True):
        finite = values.isfinite()
        answers.append((indices[finite].tolist(), values[finite].tolist()))
    return answers
