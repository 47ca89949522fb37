"""Online sessions on a recurrent state (Mamba4Rec, GRU4Rec): the Python store and its HTTP
routes."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from annotated_types import MaxLen

from seqrec.serving.http import SessionId, create_app
from seqrec.serving.predictor import Predictor, Recommendation
from seqrec.serving.sessions import SessionStore
from tests.cli.helpers import tiny_raw, train_isolated
from tests.training.http_client import call, served

RECURRENT = {
    "mamba4rec": {"name": "mamba4rec", "hidden_size": 16, "max_seq_len": 20, "state_size": 4},
    "gru4rec": {"name": "gru4rec", "hidden_size": 16, "max_seq_len": 20, "num_layers": 2},
}


@pytest.fixture(scope="module", params=sorted(RECURRENT))
def predictor(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Predictor:
    root = tmp_path_factory.mktemp(f"{request.param}-run")
    raw = tiny_raw(model=RECURRENT[request.param], train={"max_epochs": 1})
    return Predictor.from_run_dir(train_isolated(raw, root / "run", root / "cache"))


@pytest.fixture(scope="module")
def items(predictor: Predictor) -> list[str]:
    return list(predictor.id_map.items)


def assert_same(a: Recommendation, b: Recommendation) -> None:
    assert a.items == b.items
    assert a.scores == pytest.approx(b.scores, abs=1e-4)


@pytest.mark.parametrize("exclude_seen", [True, False])
def test_each_event_answers_as_recommend_on_the_whole_history(
    predictor: Predictor, items: list[str], exclude_seen: bool
) -> None:
    history = [items[7], items[3], items[7], *items[40:55:2], items[3], items[90]]
    assert len(history) <= predictor.max_seq_len
    store = SessionStore(predictor)
    started = store.start("u", history[:3], k=12, exclude_seen=exclude_seen)
    assert_same(started, predictor.recommend([history[:3]], 12, exclude_seen)[0])
    for end in range(4, len(history) + 1):
        answer = store.append("u", history[end - 1], k=12, exclude_seen=exclude_seen)
        assert_same(answer, predictor.recommend([history[:end]], 12, exclude_seen)[0])
        if exclude_seen:
            assert not set(answer.items) & set(history[:end])


def test_past_max_seq_len_a_session_has_read_every_item(
    predictor: Predictor, items: list[str]
) -> None:
    history = items[:30]
    store = SessionStore(predictor)
    store.start("long", history[:5], k=5, exclude_seen=False)
    for item in history[5:]:
        answer = store.append("long", item, k=5, exclude_seen=False)
    ids, _ = predictor.id_map.item_to_internal(history)
    with torch.inference_mode():
        _, scores = predictor.model.init_state(torch.from_numpy(ids).unsqueeze(0))
    top = scores[0, 1:].topk(5)
    assert answer.items == predictor.id_map.item_to_original((top.indices + 1).numpy())
    assert answer.scores == pytest.approx(top.values.tolist(), abs=1e-4)


def test_a_state_with_a_horizon_is_encoded_anew_past_it(tmp_path: Path) -> None:
    """Mamba4Rec with a positional embedding has no position past max_seq_len: its sessions
    answered 500 there (a ValueError from step). Past it they now answer as ``recommend``,
    which reads the most recent max_seq_len items."""
    model = {**RECURRENT["mamba4rec"], "max_seq_len": 8, "positional_embedding": True}
    raw = tiny_raw(model=model, train={"max_epochs": 1})
    predictor = Predictor.from_run_dir(train_isolated(raw, tmp_path / "run", tmp_path / "cache"))
    items = list(predictor.id_map.items)
    history = [items[3], *items[20:31], items[3], items[50]]
    store = SessionStore(predictor)
    for start in (5, 12):  # within the horizon, and a longer history than it
        answer = store.start("u", history[:start], k=12)
        assert_same(answer, predictor.recommend([history[:start]], 12)[0])
        for end in range(start + 1, len(history) + 1):
            answer = store.append("u", history[end - 1], k=12)
            assert_same(answer, predictor.recommend([history[:end]], 12)[0])


def test_a_history_given_as_a_string_is_refused(predictor: Predictor, items: list[str]) -> None:
    """start('u', '12') once started a session of items '1' and '2'."""
    with pytest.raises(TypeError, match="a history must be a list of item ids"):
        SessionStore(predictor).start("u", items[0])  # type: ignore[arg-type]


def test_an_unknown_item_leaves_the_session_unchanged(
    predictor: Predictor, items: list[str]
) -> None:
    store = SessionStore(predictor)
    store.start("u", items[:4])
    with pytest.raises(ValueError, match="'no-such-item' is not in the model's catalogue"):
        store.append("u", "no-such-item")
    assert_same(store.append("u", items[9]), predictor.recommend([[*items[:4], items[9]]])[0])


def test_appends_step_the_state_without_encoding_the_history_again(
    predictor: Predictor, items: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    history = [items[5], items[12], *items[30:36], items[5], items[70]]
    expected = [predictor.recommend([history[:end]], 8)[0] for end in range(2, len(history) + 1)]
    calls = {"init_state": 0, "step": 0}

    def counted(name: str) -> Callable[..., Any]:
        real = getattr(predictor.model, name)

        def wrapper(*args: Any) -> Any:
            calls[name] += 1
            return real(*args)

        return wrapper

    for name in calls:  # on the instance only; undone when the test ends
        monkeypatch.setitem(vars(predictor.model), name, counted(name))
    store = SessionStore(predictor)
    answers = [store.start("u", history[:2], k=8)]
    answers += [store.append("u", item, k=8) for item in history[2:]]
    assert calls == {"init_state": 1, "step": len(history) - 2}
    for answer, recommended in zip(answers, expected, strict=True):
        assert_same(answer, recommended)


def test_unknown_ids_at_the_start_are_reported(predictor: Predictor, items: list[str]) -> None:
    store = SessionStore(predictor)
    started = store.start("u", ["zz", items[2], items[8]], k=5)
    assert started.error is None
    assert started.unknown == ["zz"]
    assert_same(started, predictor.recommend([[items[2], items[8]]], 5)[0])
    after = store.append("u", items[9], k=5)
    assert_same(after, predictor.recommend([[items[2], items[8], items[9]]], 5)[0])


@pytest.mark.parametrize("history", [["zz-1", "zz-2"], []], ids=["unknown", "empty"])
def test_a_refused_restart_keeps_the_session_held(
    predictor: Predictor, items: list[str], history: list[str]
) -> None:
    store = SessionStore(predictor)
    store.start("u", items[:4])
    store.append("u", items[9])
    refused = store.start("u", history)
    assert refused.error is not None
    assert refused.unknown == history
    assert "u" in store
    after = store.append("u", items[11])
    assert_same(after, predictor.recommend([[*items[:4], items[9], items[11]]])[0])


def test_histories_without_known_items_start_nothing(predictor: Predictor) -> None:
    store = SessionStore(predictor)
    assert store.start("u", []).error == "empty history"
    refused = store.start("u", ["x", "y"])
    assert refused.error == "no known item in the history"
    assert refused.unknown == ["x", "y"]
    assert "u" not in store


def test_the_least_recently_used_session_is_dropped_beyond_capacity(
    predictor: Predictor, items: list[str]
) -> None:
    store = SessionStore(predictor, capacity=2)
    store.start("a", items[:3])
    store.start("b", items[3:6])
    store.append("a", items[10])  # "a" is now the most recent
    store.start("c", items[6:9])
    assert len(store) == 2
    assert "b" not in store
    with pytest.raises(KeyError):
        store.append("b", items[11])
    assert store.end("a")
    assert not store.end("a")
    assert len(store) == 1


def test_models_without_a_recurrent_state_have_no_sessions(tiny_run: Path) -> None:
    with pytest.raises(ValueError, match="sasrec has no recurrent state"):
        SessionStore(Predictor.from_run_dir(tiny_run))


SERVED_SESSIONS = 3  # max_sessions of the served app: small, to reach it in a test


@pytest.fixture(scope="module")
def base(predictor: Predictor) -> Iterator[str]:
    with served(create_app(predictor, max_sessions=SERVED_SESSIONS)) as url:
        yield url


def assert_same_json(answer: dict[str, Any], expected: dict[str, Any]) -> None:
    assert answer["items"] == expected["items"]
    assert answer["unknown"] == expected["unknown"]
    assert answer["scores"] == pytest.approx(expected["scores"], abs=1e-4)


def test_session_routes_answer_as_recommend(base: str, items: list[str]) -> None:
    history = ["zz", *items[20:26]]
    status, started = call(base, "/sessions/user-1", {"history": history, "k": 6}, method="PUT")
    assert status == 200
    assert started["unknown"] == ["zz"]
    assert_same_json(started, call(base, "/recommend", {"history": history, "k": 6})[1])
    status, after = call(base, "/sessions/user-1/events", {"item": items[60], "k": 6})
    assert status == 200
    expected = call(base, "/recommend", {"history": [*history[1:], items[60]], "k": 6})[1]
    assert_same_json(after, expected)
    assert call(base, "/health")[1]["sessions"] >= 1
    assert call(base, "/sessions/user-1", method="DELETE") == (204, None)
    status, missing = call(base, "/sessions/user-1/events", {"item": items[61]})
    assert status == 404
    assert "PUT /sessions/user-1 with the history" in missing["detail"]


def test_the_server_drops_the_least_recently_used_session(base: str, items: list[str]) -> None:
    first, second, *others = [f"lru-{i}" for i in range(SERVED_SESSIONS)]
    for i, session in enumerate([first, second, *others]):
        history = items[3 * i : 3 * i + 3]
        assert call(base, f"/sessions/{session}", {"history": history}, method="PUT")[0] == 200
    assert call(base, f"/sessions/{first}/events", {"item": items[30]})[0] == 200  # used last
    assert call(base, "/sessions/lru-new", {"history": items[40:43]}, method="PUT")[0] == 200
    assert call(base, "/health")[1]["sessions"] == SERVED_SESSIONS
    status, missing = call(base, f"/sessions/{second}/events", {"item": items[31]})
    assert status == 404
    assert "dropped as the least recently used" in missing["detail"]
    assert call(base, f"/sessions/{first}/events", {"item": items[31]})[0] == 200


def longest_session_id() -> int:
    """The session id length limit the routes declare (``SessionId`` in seqrec.serving.http)."""
    (path,) = SessionId.__metadata__
    return next(rule.max_length for rule in path.metadata if isinstance(rule, MaxLen))


def test_a_session_id_over_the_limit_is_422_and_serving_goes_on(
    base: str, items: list[str]
) -> None:
    longest = "s" * longest_session_id()
    assert call(base, f"/sessions/{longest}", {"history": items[:3]}, method="PUT")[0] == 200
    too_long = longest + "s"
    for method, path, body in [
        ("PUT", f"/sessions/{too_long}", {"history": items[:3]}),
        ("POST", f"/sessions/{too_long}/events", {"item": items[4]}),
        ("DELETE", f"/sessions/{too_long}", None),
    ]:
        status, answer = call(base, path, body, method=method)
        assert status == 422, method
        (error,) = answer["detail"]
        assert error["loc"] == ["path", "session_id"]
        assert f"at most {len(longest)} characters" in error["msg"]
    assert call(base, f"/sessions/{longest}/events", {"item": items[4]})[0] == 200


def test_session_routes_refuse_bad_requests(base: str, items: list[str]) -> None:
    call(base, "/sessions/u2", {"history": items[:3]}, method="PUT")
    status, answer = call(base, "/sessions/u2/events", {"item": "nope"})
    assert status == 422
    assert "'nope' is not in the model's catalogue; session unchanged" in answer["detail"]
    status, answer = call(base, "/sessions/u2", {"history": ["a", "b"]}, method="PUT")
    assert status == 422
    assert answer["detail"]["unknown"] == ["a", "b"]
    assert answer["detail"]["error"] == (
        "cannot start: no known item in the history; the session held as 'u2' is unchanged"
    )
    assert call(base, "/sessions/u2/events", {"item": items[4]})[0] == 200  # still held
    assert call(base, "/sessions/u2/events", {"items": [items[4]]})[0] == 422
    status, answer = call(base, "/sessions/u3", {"history": ["a", "b"]}, method="PUT")
    assert status == 422
    assert answer["detail"]["error"] == "cannot start: no known item in the history"
    assert call(base, "/sessions/never", method="DELETE")[0] == 404
    status, answer = call(base, "/sessions/never/events", {"item": "nope"})
    assert status == 404  # no session comes first: it was 422 for the unknown item
    assert "PUT /sessions/never with the history to start it" in answer["detail"]


@pytest.mark.parametrize(
    ("method", "path", "raw"),
    [
        ("PUT", "/sessions/s", b'{"history": [ID, "\\ud800"]}'),  # "\ud800" would be unknown
        ("PUT", "/sessions/s", b'{"history": [ID], "k": NaN}'),
        ("POST", "/sessions/s/events", b'{"item": "\\udfff"}'),
        ("POST", "/sessions/s/events", b'{"item": ID, "k": 1e400}'),
    ],
)
def test_session_routes_refuse_non_finite_numbers_and_lone_surrogates(
    base: str, items: list[str], method: str, path: str, raw: bytes
) -> None:
    assert call(base, "/sessions/s", {"history": items[:3]}, method="PUT")[0] == 200
    raw = raw.replace(b"ID", json.dumps(items[5]).encode())
    status, answer = call(base, path, raw=raw, method=method)
    assert status == 400
    assert answer["detail"].startswith("cannot read the JSON body: ")
    assert call(base, "/sessions/s/events", {"item": items[6]})[0] == 200


def test_session_routes_on_a_stateless_model_are_400(tiny_run: Path) -> None:
    with served(create_app(Predictor.from_run_dir(tiny_run))) as url:
        status, answer = call(url, "/sessions/u", {"history": ["1"]}, method="PUT")
    assert status == 400
    assert "sasrec keeps no state per session" in answer["detail"]


def test_ids_k_exclude_seen_and_capacity_of_the_wrong_type_are_refused(
    predictor: Predictor, items: list[str]
) -> None:
    with pytest.raises(TypeError, match="session capacity must be an int"):
        SessionStore(predictor, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="session capacity must be an int"):
        SessionStore(predictor, 1.5)  # type: ignore[arg-type]
    store = SessionStore(predictor)
    for session_id in (None, ["x"], 1.5, True):
        with pytest.raises(TypeError, match="session_id must be a str or an int"):
            store.start(session_id, items[:2])  # type: ignore[arg-type]
    store.start(5, items[:2])  # JSON and the CLI give ids as str or int: the same session
    assert "5" in store
    assert 5 in store
    for item in (items[2:4], None):  # a list once read as one unknown id "['3', '4']"
        with pytest.raises(TypeError, match="item must be a str or an int"):
            store.append("5", item)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="exclude_seen must be True or False"):
        store.append("5", items[2], exclude_seen="no")  # type: ignore[arg-type]
    assert_same(store.append("5", items[2], k=np.int64(4)), predictor.recommend([items[:3]], 4)[0])


def test_an_event_the_model_fails_on_leaves_the_session_as_it_was(
    predictor: Predictor, items: list[str]
) -> None:
    store = SessionStore(predictor)
    store.start("u", items[:3])
    weights = {name: tensor.clone() for name, tensor in predictor.model.state_dict().items()}
    with torch.no_grad():
        for parameter in predictor.model.parameters():
            parameter.fill_(float("nan"))
    try:
        with pytest.raises(ValueError, match="the model scored items NaN"):
            store.append("u", items[3])
        with pytest.raises(ValueError, match="the model scored items NaN"):
            store.start("u", items[10:14])
    finally:
        predictor.model.load_state_dict(weights)
    # neither the failed event nor the failed restart reached the session
    assert_same(store.append("u", items[4]), predictor.recommend([[*items[:3], items[4]]])[0])
