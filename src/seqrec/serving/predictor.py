"""Recommendations from a trained run directory: original ids in, original ids and scores out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from seqrec.batch import PAD_ID
from seqrec.data.idmap import IdMap
from seqrec.models.base import ScoringRecommender, SequentialRecommender
from seqrec.training.checkpoint import load_run


@dataclass(frozen=True)
class Recommendation:
    """Top items for one history; ``unknown`` lists history ids the model has never seen."""

    items: list[str]
    scores: list[float] | None
    unknown: list[str] = field(default_factory=list)
    error: str | None = None  # set when nothing could be recommended (e.g. empty history)


class Predictor:
    """Loads a model once and answers batches of histories."""

    def __init__(
        self, model: SequentialRecommender, id_map: IdMap, device: str | torch.device = "cpu"
    ) -> None:
        self.model = model.to(device).eval()
        self.id_map = id_map
        self.device = torch.device(device)
        self.max_seq_len = int(model.config.max_seq_len)

    @classmethod
    def from_run_dir(cls, path: str | Path, device: str = "cpu") -> Predictor:
        run = load_run(path)
        return cls(run.model, run.id_map, device)

    def _encode(
        self, histories: Sequence[Sequence[str]]
    ) -> tuple[list[np.ndarray], list[list[str]]]:
        known, unknown = [], []
        for history in histories:
            ids, missing = self.id_map.item_to_internal([str(item) for item in history])
            known.append(ids[-self.max_seq_len :])
            unknown.append(missing)
        return known, unknown

    @torch.inference_mode()
    def recommend(
        self, histories: Sequence[Sequence[str]], k: int = 10, exclude_seen: bool = True
    ) -> list[Recommendation]:
        """One ``Recommendation`` per history, in order; a bad history gets ``error``."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if self.model.uses_users:
            raise ValueError(
                "this model needs user ids (a user embedding); it cannot serve histories"
            )
        known, unknown = self._encode(histories)
        results: list[Recommendation | None] = [None] * len(histories)
        rows = [i for i, ids in enumerate(known) if len(ids) > 0]
        for i, ids in enumerate(known):
            if len(ids) == 0:
                reason = "empty history" if not unknown[i] else "no known item in the history"
                results[i] = Recommendation([], None, unknown[i], reason)
        if rows:
            width = max(len(known[i]) for i in rows)
            input_ids = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
            for row, i in enumerate(rows):
                input_ids[row, width - len(known[i]) :] = torch.from_numpy(known[i])
            top, scores = self._top(input_ids.to(self.device), k, exclude_seen)
            for row, i in enumerate(rows):
                results[i] = Recommendation(
                    items=self.id_map.item_to_original(top[row]),
                    scores=None if scores is None else [float(s) for s in scores[row]],
                    unknown=unknown[i],
                )
        return [r for r in results if r is not None]

    def _top(
        self, input_ids: torch.Tensor, k: int, exclude_seen: bool
    ) -> tuple[np.ndarray, np.ndarray | None]:
        if isinstance(self.model, ScoringRecommender):
            scores = self.model.score(input_ids).float()
            scores[:, PAD_ID] = float("-inf")
            if exclude_seen:
                scores = scores.scatter(1, input_ids, float("-inf"))
            top = scores.topk(min(k, scores.size(1) - 1), dim=1)
            finite = top.values.isfinite()
            if not finite.all():  # fewer unseen items than k
                keep = int(finite.sum(dim=1).min())
                return top.indices[:, :keep].cpu().numpy(), top.values[:, :keep].cpu().numpy()
            return top.indices.cpu().numpy(), top.values.cpu().numpy()
        top_ids = self.model.recommend(input_ids, k, exclude_seen)
        return top_ids.cpu().numpy(), None
