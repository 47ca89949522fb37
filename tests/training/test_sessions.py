"""Online sessions on a recurrent state (Mamba4Rec, GRU4Rec): the Python store and its HTTP
routes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from seqrec.serving.http import create_app
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


def test_an_unknown_item_leaves_the_session_unchanged(
    predictor: Predictor, items: list[str]
) -> None:
    store = SessionStore(predictor)
    store.start("u", items[:4])
    with pytest.raises(ValueError, match="'no-such-item' is not in the model's catalogue"):
        store.append("u", "no-such-item")
    assert_same(store.append("u", items[9]), predictor.recommend([[*items[:4], items[9]]])[0])


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


@pytest.fixture(scope="module")
def base(predictor: Predictor) -> Iterator[str]:
    with served(create_app(predictor, max_sessions=3)) as url:
        yield url


def test_session_routes_answer_as_recommend(base: str, items: list[str]) -> None:
    history = items[20:26]
    status, started = call(base, "/sessions/user-1", {"history": history, "k": 6}, method="PUT")
    assert status == 200
    assert started == call(base, "/recommend", {"history": history, "k": 6})[1] | {
        "scores": pytest.approx(started["scores"], abs=1e-4)
    }
    status, after = call(base, "/sessions/user-1/events", {"item": items[60], "k": 6})
    assert status == 200
    expected = call(base, "/recommend", {"history": [*history, items[60]], "k": 6})[1]
    assert after["items"] == expected["items"]
    assert after["scores"] == pytest.approx(expected["scores"], abs=1e-4)
    assert call(base, "/health")[1]["sessions"] >= 1
    assert call(base, "/sessions/user-1", method="DELETE") == (204, None)
    status, missing = call(base, "/sessions/user-1/events", {"item": items[61]})
    assert status == 404
    assert "PUT /sessions/user-1 with the history" in missing["detail"]


def test_session_routes_refuse_bad_requests(base: str, items: list[str]) -> None:
    call(base, "/sessions/u2", {"history": items[:3]}, method="PUT")
    status, answer = call(base, "/sessions/u2/events", {"item": "nope"})
    assert status == 422
    assert "'nope' is not in the model's catalogue; session unchanged" in answer["detail"]
    assert call(base, "/sessions/u2/events", {"items": [items[4]]})[0] == 422
    status, answer = call(base, "/sessions/u3", {"history": ["a", "b"]}, method="PUT")
    assert status == 422
    assert answer["detail"]["error"] == "cannot start: no known item in the history"
    assert call(base, "/sessions/never", method="DELETE")[0] == 404


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
