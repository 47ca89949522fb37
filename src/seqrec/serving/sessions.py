"""Online sessions for models with a recurrent state (GRU4Rec, Mamba4Rec): each new item
updates the user's state in O(1) instead of re-encoding the history.

A session starts from a history (``start``: one full encoding), then takes one item at a time
(``append``: one recurrent step). Its recommendations equal those of ``Predictor.recommend``
on the whole history as long as that fits in ``max_seq_len``; past it, the session has seen
every item while ``recommend`` reads the most recent ``max_seq_len``. A model whose state
cannot grow past a horizon (Mamba4Rec with a positional embedding) re-encodes the session's
most recent ``horizon`` items at each event past it, and then answers as ``recommend`` does.

Sessions live in memory, at most ``capacity`` of them: starting one more drops the least
recently used. A dropped or never-started session is a ``KeyError``; the client starts it
again from the history it holds.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from seqrec.serving.predictor import (
    Predictor,
    Recommendation,
    check_exclude_seen,
    check_history,
    check_k,
    nothing_known,
    top_items,
)


class UnknownItemError(ValueError):
    """An event's item is outside the model's catalogue; the session is unchanged."""


def check_id(what: str, value: object) -> str:
    """A session or item id: a str, or an int (as JSON and the CLI give them), as a str."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (str, int, np.integer)):
        raise TypeError(f"{what} must be a str or an int, got {type(value).__name__} {value!r:.60}")
    return str(value)


@runtime_checkable
class RecurrentRecommender(Protocol):
    """A model whose users' state can be built from a history and extended item by item.

    A model whose state cannot grow past some length also has ``state_horizon``, that
    length (None: no limit); without the attribute there is none."""

    def init_state(self, input_ids: Tensor) -> tuple[Any, Tensor]: ...

    def step(self, state: Any, item_ids: Tensor) -> tuple[Any, Tensor]: ...


def state_horizon(model: RecurrentRecommender) -> int | None:
    horizon: int | None = getattr(model, "state_horizon", None)
    return horizon


def supports_sessions(predictor: Predictor) -> bool:
    return isinstance(predictor.model, RecurrentRecommender)


@dataclass
class _Session:
    state: Any  # the model's state for one user (batch of 1)
    seen: set[int]  # internal ids of every item of the session
    # the items the state holds, for a model with a state_horizon (at most that many; else None)
    recent: npt.NDArray[np.int64] | None


class SessionStore:
    """The sessions of one predictor's model, safe to use from several threads."""

    def __init__(self, predictor: Predictor, capacity: int = 10_000) -> None:
        if not supports_sessions(predictor):
            raise ValueError(
                f"{predictor.model.config.name} has no recurrent state to keep per session "
                "(models with one, with init_state and step: gru4rec, mamba4rec)"
            )
        if isinstance(capacity, bool) or not isinstance(capacity, int):
            raise TypeError(f"session capacity must be an int, got {capacity!r}")
        if capacity < 1:
            raise ValueError(f"session capacity must be >= 1, got {capacity}")
        self.predictor = predictor
        self.capacity = capacity
        self._sessions: OrderedDict[str, _Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return isinstance(session_id, (str, int)) and str(session_id) in self._sessions

    def start(
        self, session_id: str, history: Sequence[str], k: int = 10, exclude_seen: bool = True
    ) -> Recommendation:
        """(Re)start a session from a history, oldest first; with no known item in it the
        answer carries ``error`` and nothing changes: a session held under ``session_id``
        stays as it was (a failed PUT leaves its resource alone), which the error says."""
        session_id = check_id("session_id", session_id)
        k = check_k(k)
        check_exclude_seen(exclude_seen)
        check_history(history)
        ids, unknown = self.predictor.id_map.item_to_internal([str(item) for item in history])
        if len(ids) == 0:
            refused = nothing_known(unknown)
            if session_id in self._sessions:
                held = f"{refused.error}; the session held as {session_id!r} is unchanged"
                refused = replace(refused, error=held)
            return refused
        with self.predictor.exclusive() as model, torch.inference_mode():
            assert isinstance(model, RecurrentRecommender)
            input_ids = torch.from_numpy(ids).unsqueeze(0).to(self.predictor.device)
            state, scores = model.init_state(input_ids)
            horizon = state_horizon(model)
            recent = None if horizon is None else ids[-horizon:].copy()
            session = _Session(state, set(ids.tolist()), recent)
            answer = self._answer(session.seen, scores, k, exclude_seen, unknown)
            self._sessions[session_id] = session  # only once answered: a failure changes nothing
            self._sessions.move_to_end(session_id)
            while len(self._sessions) > self.capacity:
                self._sessions.popitem(last=False)
            return answer

    def append(
        self, session_id: str, item: str, k: int = 10, exclude_seen: bool = True
    ) -> Recommendation:
        """Add one item to a session: ``KeyError`` for a session not held,
        ``UnknownItemError`` (session unchanged) for an item outside the catalogue."""
        session_id = check_id("session_id", session_id)
        item = check_id("item", item)
        k = check_k(k)
        check_exclude_seen(exclude_seen)
        ids, _ = self.predictor.id_map.item_to_internal([item])
        with self.predictor.exclusive() as model, torch.inference_mode():
            assert isinstance(model, RecurrentRecommender)
            session = self._sessions[session_id]  # KeyError: not started, or dropped
            if len(ids) == 0:  # after the session: a session not held is that error first
                raise UnknownItemError(
                    f"item {item!r} is not in the model's catalogue; session unchanged"
                )
            horizon = state_horizon(model)
            recent = None if session.recent is None else np.concatenate([session.recent, ids])
            if horizon is not None and recent is not None and len(recent) > horizon:
                # the state is full: encode the most recent items anew, as recommend reads them
                recent = recent[-horizon:]
                input_ids = torch.from_numpy(recent).unsqueeze(0).to(self.predictor.device)
                state, scores = model.init_state(input_ids)
            else:
                item_ids = torch.from_numpy(ids).to(self.predictor.device)
                state, scores = model.step(session.state, item_ids)
            seen = session.seen | {int(ids[0])}
            answer = self._answer(seen, scores, k, exclude_seen, [])
            # only once answered, as in start
            session.state, session.seen, session.recent = state, seen, recent
            self._sessions.move_to_end(session_id)
            return answer

    def end(self, session_id: str) -> bool:
        """Forget a session; False when it was not held."""
        session_id = check_id("session_id", session_id)
        with self.predictor.exclusive():
            return self._sessions.pop(session_id, None) is not None

    def _answer(
        self, seen: set[int], scores: Tensor, k: int, exclude_seen: bool, unknown: list[str]
    ) -> Recommendation:
        excluded: list[npt.NDArray[np.int64]] | None = None
        if exclude_seen:
            excluded = [np.fromiter(seen, dtype=np.int64, count=len(seen))]
        scores = scores.float().cpu().clone()  # (1, N + 1); top_items writes into it
        ((items, values),) = top_items(scores, excluded, k)
        return Recommendation(self.predictor.id_map.item_to_original(items), values, unknown)
