"""Online sessions for models with a recurrent state (GRU4Rec, Mamba4Rec): each new item
updates the user's state in O(1) instead of re-encoding the history.

A session starts from a history (``start``: one full encoding), then takes one item at a time
(``append``: one recurrent step). Its recommendations equal those of ``Predictor.recommend``
on the whole history as long as that fits in ``max_seq_len``; past it, the session has seen
every item while ``recommend`` reads the most recent ``max_seq_len``.

Sessions live in memory, at most ``capacity`` of them: starting one more drops the least
recently used. A dropped or never-started session is a ``KeyError``; the client starts it
again from the history it holds.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from seqrec.serving.predictor import (
    Predictor,
    Recommendation,
    check_history,
    check_k,
    nothing_known,
    top_items,
)


@runtime_checkable
class RecurrentRecommender(Protocol):
    """A model whose users' state can be built from a history and extended item by item."""

    def init_state(self, input_ids: Tensor) -> tuple[Any, Tensor]: ...

    def step(self, state: Any, item_ids: Tensor) -> tuple[Any, Tensor]: ...


def supports_sessions(predictor: Predictor) -> bool:
    return isinstance(predictor.model, RecurrentRecommender)


@dataclass
class _Session:
    state: Any  # the model's state for one user (batch of 1)
    seen: set[int]  # internal ids of every item of the session


class SessionStore:
    """The sessions of one predictor's model, safe to use from several threads."""

    def __init__(self, predictor: Predictor, capacity: int = 10_000) -> None:
        if not supports_sessions(predictor):
            raise ValueError(
                f"{predictor.model.config.name} has no recurrent state to keep per session "
                "(models with one: gru4rec, mamba4rec)"
            )
        if capacity < 1:
            raise ValueError(f"session capacity must be >= 1, got {capacity}")
        self.predictor = predictor
        self.capacity = capacity
        self._sessions: OrderedDict[str, _Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def start(
        self, session_id: str, history: Sequence[str], k: int = 10, exclude_seen: bool = True
    ) -> Recommendation:
        """(Re)start a session from a history, oldest first; with no known item in it the
        session is not started and the answer carries ``error``."""
        check_k(k)
        check_history(history)
        ids, unknown = self.predictor.id_map.item_to_internal([str(item) for item in history])
        if len(ids) == 0:
            return nothing_known(unknown)
        with self.predictor.exclusive() as model, torch.inference_mode():
            assert isinstance(model, RecurrentRecommender)
            input_ids = torch.from_numpy(ids).unsqueeze(0).to(self.predictor.device)
            state, scores = model.init_state(input_ids)
            session = _Session(state, set(ids.tolist()))
            self._sessions[session_id] = session
            self._sessions.move_to_end(session_id)
            while len(self._sessions) > self.capacity:
                self._sessions.popitem(last=False)
            return self._answer(session, scores, k, exclude_seen, unknown)

    def append(
        self, session_id: str, item: str, k: int = 10, exclude_seen: bool = True
    ) -> Recommendation:
        """Add one item to a session: ``KeyError`` for a session not held, ``ValueError``
        (session unchanged) for an item outside the catalogue."""
        check_k(k)
        ids, _ = self.predictor.id_map.item_to_internal([str(item)])
        with self.predictor.exclusive() as model, torch.inference_mode():
            assert isinstance(model, RecurrentRecommender)
            session = self._sessions[session_id]  # KeyError: not started, or dropped
            if len(ids) == 0:  # after the session: a session not held is that error first
                raise ValueError(
                    f"item {item!r} is not in the model's catalogue; session unchanged"
                )
            item_ids = torch.from_numpy(ids).to(self.predictor.device)
            session.state, scores = model.step(session.state, item_ids)
            session.seen.add(int(ids[0]))
            self._sessions.move_to_end(session_id)
            return self._answer(session, scores, k, exclude_seen, [])

    def end(self, session_id: str) -> bool:
        """Forget a session; False when it was not held."""
        with self.predictor.exclusive():
            return self._sessions.pop(session_id, None) is not None

    def _answer(
        self, session: _Session, scores: Tensor, k: int, exclude_seen: bool, unknown: list[str]
    ) -> Recommendation:
        seen: list[npt.NDArray[np.int64]] | None = None
        if exclude_seen:
            seen = [np.fromiter(session.seen, dtype=np.int64, count=len(session.seen))]
        scores = scores.float().cpu().clone()  # (1, N + 1); top_items writes into it
        ((items, values),) = top_items(scores, seen, k)
        return Recommendation(self.predictor.id_map.item_to_original(items), values, unknown)
