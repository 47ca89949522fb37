"""``seqrec serve``: the HTTP app over a real socket, in process and as the CLI command."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import torch

from seqrec.cli import _url
from seqrec.config import ConfigError
from seqrec.models.recrec import RecRecConfig
from seqrec.serving.http import MAX_BATCH, MAX_K, bind, create_app
from seqrec.serving.predictor import Predictor, Recommendation
from tests.cli.helpers import train_recrec_stage_2
from tests.training.http_client import call, served


@pytest.fixture(scope="module")
def predictor(tiny_run: Path) -> Predictor:
    return Predictor.from_run_dir(tiny_run)


@pytest.fixture(scope="module")
def base(predictor: Predictor) -> Iterator[str]:
    with served(create_app(predictor)) as url:
        yield url


@pytest.fixture(scope="module")
def items(predictor: Predictor) -> list[str]:
    return list(predictor.id_map.items)


def test_health_names_the_model(base: str, predictor: Predictor) -> None:
    status, body = call(base, "/health")
    assert status == 200
    assert body == {
        "status": "ok",
        "model": "sasrec",
        "num_items": len(predictor.id_map.items),
        "max_seq_len": predictor.max_seq_len,
        "inference_settings": [],
        "sessions": None,
    }


def test_recommend_answers_what_the_predictor_answers(
    base: str, predictor: Predictor, items: list[str]
) -> None:
    history = [items[4], items[9], "never-seen", items[2]]
    status, body = call(base, "/recommend", {"history": history, "k": 7})
    assert status == 200
    (expected,) = predictor.recommend([history], 7)
    assert body["items"] == expected.items
    assert body["scores"] == pytest.approx(expected.scores, abs=1e-6)
    assert body["unknown"] == ["never-seen"]
    assert not set(body["items"]) & set(history)  # seen items excluded by default
    kept = call(base, "/recommend", {"history": history, "k": 7, "exclude_seen": False})[1]
    assert kept["items"] == predictor.recommend([history], 7, exclude_seen=False)[0].items


def test_numeric_ids_are_read_as_their_text(base: str, items: list[str]) -> None:
    numeric = [item for item in items if item.isdigit()][:3]
    assert numeric, "the tiny run's ids are numbers"
    as_text = call(base, "/recommend", {"history": numeric})[1]
    as_numbers = call(base, "/recommend", {"history": [int(i) for i in numeric]})[1]
    assert as_numbers == as_text


def test_batch_answers_each_history_and_reports_bad_ones(
    base: str, predictor: Predictor, items: list[str]
) -> None:
    histories = [items[:5], [], ["nobody-knows"], items[10:30]]
    status, body = call(base, "/recommend/batch", {"histories": histories, "k": 3})
    assert status == 200
    results = body["results"]
    expected = predictor.recommend(histories, 3)
    assert [r["items"] for r in results] == [e.items for e in expected]
    assert [r["error"] for r in results] == [
        None,
        "empty history",
        "no known item in the history",
        None,
    ]
    assert results[2]["unknown"] == ["nobody-knows"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"history": "1 2 3"}, "history"),
        ({"history": [1.5]}, "history"),
        ({"history": ["1"], "k": 0}, "k"),
        ({"history": ["1"], "k": "ten"}, "k"),
        ({"history": ["1"], "k": True}, "k"),
        ({"history": ["1"], "k": "5"}, "k"),
        ({"history": ["1"], "k": 5.5}, "k"),
        ({"history": ["1"], "exclude_seen": "no"}, "exclude_seen"),
        ({"history": ["1"], "colour": "red"}, "colour"),
        ({}, "history"),
    ],
)
def test_malformed_requests_get_422_naming_the_field(
    base: str, body: dict[str, Any], field: str
) -> None:
    status, answer = call(base, "/recommend", body)
    assert status == 422
    assert any(field in error["loc"] for error in answer["detail"])


@pytest.mark.parametrize(
    ("route", "field", "limit"),
    [
        ("/recommend", "k", MAX_K),
        ("/recommend/batch", "k", MAX_K),
        ("/recommend/batch", "histories", MAX_BATCH),
    ],
)
def test_a_request_over_a_limit_is_422_naming_it_and_serving_goes_on(
    base: str, items: list[str], route: str, field: str, limit: int
) -> None:
    def request(size: int) -> dict[str, Any]:
        """A body whose ``field`` has ``size``: k itself, or that many histories."""
        body: dict[str, Any] = {"k": size} if field == "k" else {}
        if route == "/recommend":
            return body | {"history": items[:3]}
        return body | {"histories": [items[:3]] * (size if field == "histories" else 2)}

    assert call(base, route, request(limit))[0] == 200
    status, answer = call(base, route, request(limit + 1))
    assert status == 422
    (error,) = answer["detail"]
    assert error["loc"] == ["body", field]
    assert str(limit) in error["msg"]
    assert call(base, "/recommend", {"history": items[:3]})[0] == 200


def test_broken_json_and_bad_paths_get_clear_errors(base: str) -> None:
    status, answer = call(base, "/recommend", raw=b'{"history": [1, 2')
    assert status == 422
    assert answer["detail"][0]["type"] == "json_invalid"
    assert call(base, "/recommend/batch", {"histories": []})[0] == 422
    assert call(base, "/nothing-here")[0] == 404
    assert call(base, "/health", {"history": []})[0] == 405


def test_a_history_without_known_items_is_422_with_the_unknown_ids(base: str) -> None:
    status, answer = call(base, "/recommend", {"history": ["x-1", "x-2"]})
    assert status == 422
    assert answer["detail"] == {
        "error": "cannot recommend: no known item in the history",
        "unknown": ["x-1", "x-2"],
    }
    assert call(base, "/recommend", {"history": []})[1]["detail"]["error"] == (
        "cannot recommend: empty history"
    )


def test_settings_the_model_does_not_have_are_400(base: str, items: list[str]) -> None:
    status, answer = call(base, "/recommend", {"history": items[:3], "settings": {"depth": 2}})
    assert status == 400
    assert "model.depth cannot change after training" in answer["detail"]


def test_concurrent_requests_get_their_own_answers(base: str, items: list[str]) -> None:
    histories = [items[i : i + 6] for i in range(0, 48, 6)]
    alone = [call(base, "/recommend", {"history": h, "k": 5})[1]["items"] for h in histories]
    together: dict[int, list[str]] = {}

    def ask(index: int) -> None:
        together[index] = call(base, "/recommend", {"history": histories[index], "k": 5})[1][
            "items"
        ]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(histories))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert [together[i] for i in range(len(histories))] == alone


@pytest.fixture(scope="module")
def recrec_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A RecRec stage-2 run: its depth is an inference setting."""
    return train_recrec_stage_2(tmp_path_factory.mktemp("recrec-run"))


def test_settings_of_one_request_do_not_leak_into_concurrent_ones(recrec_run: Path) -> None:
    shallow = {"depth": 0}
    # The expected answers come from predictors loaded with each depth, asked one at a time
    # and never given per-call settings.
    loaded = {False: Predictor.from_run_dir(recrec_run)}
    loaded[True] = Predictor.from_run_dir(recrec_run, settings=shallow)
    items = list(loaded[False].id_map.items)
    histories = [items[i : i + 3 + i % 7] for i in range(0, 60, 5)]
    expected: dict[tuple[int, bool], Recommendation] = {}  # (history, shallow) -> answer
    for index, history in enumerate(histories):
        for is_shallow, predictor in loaded.items():
            expected[index, is_shallow] = predictor.recommend([history], 5)[0]
        assert expected[index, True].scores != pytest.approx(expected[index, False].scores)
    # each history asked 4 times, twice shallow; thread t asks every 6th request from t on
    asked = [(index, (index + rep) % 2 == 1) for rep in range(4) for index in range(len(histories))]
    answers: dict[int, tuple[int, Any]] = {}

    def ask(url: str, thread: int) -> None:
        for n in range(thread, len(asked), 6):
            index, is_shallow = asked[n]
            body = {"history": histories[index], "k": 5} | (
                {"settings": shallow} if is_shallow else {}
            )
            answers[n] = call(url, "/recommend", body)

    with served(create_app(Predictor.from_run_dir(recrec_run))) as url:
        threads = [threading.Thread(target=ask, args=(url, i)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        later = call(url, "/recommend", {"history": histories[0], "k": 5})
    assert sorted(answers) == list(range(len(asked)))
    for n, (index, is_shallow) in enumerate(asked):
        status, body = answers[n]
        assert status == 200
        assert body["items"] == expected[index, is_shallow].items, (index, is_shallow)
        assert body["scores"] == pytest.approx(expected[index, is_shallow].scores, abs=1e-5)
    assert later[1]["items"] == expected[0, False].items  # the loaded depth is back
    assert later[1]["scores"] == pytest.approx(expected[0, False].scores, abs=1e-5)


def test_a_setting_above_the_served_limit_is_422_before_any_work(recrec_run: Path) -> None:
    """One request holds the model: depth 10,000 took 22 s of everyone's time."""
    predictor = Predictor.from_run_dir(recrec_run)
    history = list(predictor.id_map.items[:3])
    limit = RecRecConfig.served_limits["depth"]
    with served(create_app(predictor)) as url:
        status, answer = call(url, "/recommend", {"history": history, "settings": {"depth": 10**9}})
        assert status == 422
        assert answer["detail"] == (
            f"settings.depth 1000000000 is above this server's limit of {limit} (requests are "
            "answered one at a time); evaluate or recommend offline for more"
        )
        deepest = {"history": history, "settings": {"depth": limit}}
        assert call(url, "/recommend", deepest)[0] == 200


def test_a_model_that_scores_nan_is_a_500_with_its_reason_as_json(
    tiny_run: Path, caplog: pytest.LogCaptureFixture
) -> None:
    predictor = Predictor.from_run_dir(tiny_run)
    with torch.no_grad():
        next(iter(predictor.model.parameters())).fill_(float("nan"))
    history = list(predictor.id_map.items[:2])
    with served(create_app(predictor)) as url, caplog.at_level("ERROR"):
        status, answer = call(url, "/recommend", {"history": history})
    assert status == 500
    assert answer["detail"].startswith("the model scored items NaN")
    assert "Traceback" not in caplog.text
    assert "POST /recommend: the model scored items NaN" in caplog.text


def test_json_nested_too_deeply_is_a_400_that_says_so(base: str) -> None:
    body = '{"history": ' + "[" * 100_000 + "]" * 100_000 + "}"
    status, answer = call(base, "/recommend", raw=body.encode())
    assert status == 400
    assert answer["detail"] == "cannot read the JSON body: its arrays or objects nest too deeply"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_seqrec_serve_listens_answers_and_stops_on_sigint_or_sigterm(
    tiny_run: Path, signum: int
) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "seqrec.cli", "serve", str(tiny_run), "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        for _ in range(50):  # warnings may come first
            if line.startswith("serving ") or not line:
                break
            line = process.stderr.readline()
        assert line.startswith(f"serving {tiny_run} on http://127.0.0.1:"), line
        base = line.split(" on ")[1].split()[0]
        deadline = time.monotonic() + 60
        while True:  # the socket listens before uvicorn answers: retry until it does
            try:
                status, body = call(base, "/health")
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "seqrec serve did not answer"
                time.sleep(0.1)
        assert status == 200
        assert body["model"] == "sasrec"
        process.send_signal(signum)
        assert process.wait(timeout=30) == 0  # a clean shutdown either way
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_seqrec_serve_refuses_a_busy_port_in_one_line(tiny_run: Path) -> None:
    sock = bind("127.0.0.1", 0)
    try:
        port = str(sock.getsockname()[1])
        done = subprocess.run(
            [sys.executable, "-m", "seqrec.cli", "serve", str(tiny_run), "--port", port],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        sock.close()
    assert done.returncode != 0
    assert (
        done.stderr.strip().splitlines()[-1].startswith(f"error: cannot listen on 127.0.0.1:{port}")
    )
    assert "Traceback" not in done.stderr


def test_a_body_over_the_limit_is_refused_unread(predictor: Predictor, items: list[str]) -> None:
    with served(create_app(predictor, max_body_bytes=200)) as url:
        small = {"history": items[:3]}
        assert call(url, "/recommend", small)[0] == 200
        status, answer = call(url, "/recommend", {"history": items[:3] * 30})
    assert status == 413
    assert answer["detail"].endswith("bytes; the limit is 200")


def send(base: str, path: str, body: bytes | Iterable[bytes], content_type: str) -> tuple[int, Any]:
    """(status, decoded JSON) of a POST of ``body``: with a Content-Length when it is bytes,
    chunked (no Content-Length) when it is an iterable of chunks."""
    address = urlsplit(base)
    assert address.hostname is not None
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    try:
        connection.request("POST", path, body=body, headers={"Content-Type": content_type})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_a_chunked_body_is_refused_once_it_passes_the_limit(
    predictor: Predictor, items: list[str]
) -> None:
    small = json.dumps({"history": items[:3]}).encode()
    large = json.dumps({"history": items[:3] * 30}).encode()
    assert len(small) < 200 < len(large)
    with served(create_app(predictor, max_body_bytes=200)) as url:
        assert send(url, "/recommend", [small[:10], small[10:]], "application/json")[0] == 200
        chunks = [large[start : start + 64] for start in range(0, len(large), 64)]
        status, answer = send(url, "/recommend", chunks, "application/json")
        assert call(url, "/recommend", {"history": items[:3]})[0] == 200
    assert status == 413
    received = re.fullmatch(
        r"request body of at least (\d+) bytes; the limit is 200", answer["detail"]
    )
    assert received is not None
    assert 200 < int(received[1]) <= len(large)


# JSON that Python reads but no response can hold: (the history, the rest of the body)
NOT_RENDERABLE = {
    "NaN": (b'["ID"]', b', "k": NaN'),
    "Infinity": (b'["ID"]', b', "k": Infinity'),
    "-Infinity": (b'["ID"]', b', "exclude_seen": -Infinity'),
    "1e400": (b'["ID"]', b', "k": 1e400'),
    "setting": (b'["ID"]', b', "settings": {"depth": NaN}'),
    "escaped surrogate": (b'["\\ud800"]', b""),
    "surrogate bytes": (b'["\xed\xa0\x80"]', b""),
    "unknown surrogate": (b'["ID", "\\udfff"]', b', "k": 2'),  # the 200 path lists it as unknown
    "surrogate key": (b'["ID"]', b', "\\ud83d": 1'),
}


@pytest.mark.parametrize("batch", [False, True], ids=["recommend", "batch"])
@pytest.mark.parametrize("case", list(NOT_RENDERABLE.values()), ids=list(NOT_RENDERABLE))
def test_non_finite_numbers_and_lone_surrogates_are_400_and_serving_goes_on(
    base: str, items: list[str], batch: bool, case: tuple[bytes, bytes]
) -> None:
    history, rest = case
    history = history.replace(b'"ID"', json.dumps(items[0]).encode())
    if batch:
        route, raw = "/recommend/batch", b'{"histories": [' + history + b"]" + rest + b"}"
    else:
        route, raw = "/recommend", b'{"history": ' + history + rest + b"}"
    status, answer = call(base, route, raw=raw)
    assert status == 400
    assert answer["detail"].startswith("cannot read the JSON body: ")
    assert "finite" in answer["detail"] or "lone UTF-16 surrogate" in answer["detail"]
    assert call(base, "/recommend", {"history": items[:3]})[0] == 200


def test_a_body_that_is_not_json_gets_422_without_its_bytes(base: str, items: list[str]) -> None:
    status, answer = send(base, "/recommend", b"\xff\xfe not UTF-8", "text/plain")
    assert status == 422
    assert answer["detail"][0]["loc"] == ["body"]
    assert "input" not in answer["detail"][0]
    assert answer["detail"][-1]["loc"] == ["header", "content-type"]  # what to send instead
    assert "application/json, not 'text/plain'" in answer["detail"][-1]["msg"]
    body = json.dumps({"history": items[:3]}).encode()  # curl -d sends form-urlencoded
    status, answer = send(base, "/recommend", body, "application/x-www-form-urlencoded")
    assert status == 422
    assert "Content-Type: application/json" in answer["detail"][-1]["msg"]
    body = json.dumps({"history": items[:3], "k": 0}).encode()  # read as JSON without a type
    status, answer = send(base, "/recommend", body, "")
    assert status == 422
    assert all(error["loc"][0] == "body" for error in answer["detail"])  # no header hint
    assert call(base, "/recommend", {"history": items[:3]})[0] == 200


@pytest.mark.parametrize(
    ("host", "url"),
    [("127.0.0.1", "http://127.0.0.1:8000"), ("::1", "http://[::1]:8000")],
)
def test_the_start_up_line_names_a_url_a_client_can_use(host: str, url: str) -> None:
    assert _url(host, 8000) == url
    assert urlsplit(_url(host, 8000)).port == 8000  # "http://::1:8000" has no port


@pytest.mark.parametrize("port", [-1, 65536, 70000])
def test_a_port_out_of_range_is_a_config_error(port: int) -> None:
    with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}: .* 0-65535"):
        bind("127.0.0.1", port)


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--port", "70000", "65535"),
        ("--threads", "0", "--threads"),
        ("--max-sessions", "0", "--max-sessions must be >= 1"),  # accepted for SASRec once
    ],
)
def test_seqrec_serve_refuses_a_flag_out_of_range_in_one_line(
    tiny_run: Path, flag: str, value: str, named: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "seqrec.cli", "serve", str(tiny_run), flag, value],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: ")
    assert named in done.stderr
    assert "unexpected" not in done.stderr
    assert "Traceback" not in done.stderr


def test_seqrec_serve_without_the_serve_extra_says_how_to_install_it(
    tiny_run: Path, tmp_path: Path
) -> None:
    shim = tmp_path / "fastapi"
    shim.mkdir()
    (shim / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'fastapi'\", name='fastapi')\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "seqrec.cli", "serve", str(tiny_run), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: seqrec serve needs the serve extra (No module named 'fastapi'): "
        "pip install 'seqrec[serve]'"
    )


def test_the_openapi_schema_lists_every_route(base: str) -> None:
    status, schema = call(base, "/openapi.json")
    assert status == 200
    assert set(schema["paths"]) == {
        "/health",
        "/recommend",
        "/recommend/batch",
        "/sessions/{session_id}",
        "/sessions/{session_id}/events",
    }
