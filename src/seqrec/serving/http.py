"""Online serving over HTTP: a FastAPI app around ``Predictor`` (extra ``serve``).

    GET  /health            the loaded model: name, catalogue size, inference settings
    POST /recommend         {"history": ["1193", "661"], "k": 10} -> {"items", "scores", "unknown"}
    POST /recommend/batch   {"histories": [[...], ...], "k": 10} -> {"results": [...]}

and, for models with a recurrent state (GRU4Rec, Mamba4Rec), sessions updated in O(1) per new item
(``seqrec.serving.sessions``):

    PUT    /sessions/{id}          {"history": [...], "k": 10} -> start (or restart) a session
    POST   /sessions/{id}/events   {"item": "2355", "k": 10}   -> add one item, recommend
    DELETE /sessions/{id}

Item ids are the original ids of the training log, as strings (numbers are accepted and read
as their decimal text). Both POSTs take ``exclude_seen`` (default true) and ``settings``, the
model's inference settings for this request only (``{"depth": 2}`` for RecRec, ``{"beam_size":
20}`` for TIGER). ``/recommend`` is stateless: each request carries the whole history.

Errors are JSON ``{"detail": ...}``: 422 for a malformed body (FastAPI's field-by-field
list, without the rejected values), 400 for a body with NaN, Infinity, a number beyond a
float's range or a string with a lone UTF-16 surrogate (no response could echo them), 400 for
settings the model does not have, 422 with the unknown ids for a single history with no known
item, 413 for a body larger than 64 MiB (chunked or not). In a batch, a history with no known
item gets its own ``error`` and the rest are answered. A session not held (never started,
ended, or dropped as the least recently used beyond the capacity) is 404; an event with an
item outside the catalogue is 422 and leaves the session unchanged; sessions on a model
without a recurrent state are 400.
"""

from __future__ import annotations

import json
import logging
import math
import re
import socket
from collections.abc import Callable, Coroutine, Iterator
from typing import Annotated, Any

from fastapi import FastAPI, HTTPException, Path, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from seqrec.config import ConfigError
from seqrec.serving.predictor import Predictor, Recommendation, check_serves_histories
from seqrec.serving.sessions import SessionStore, UnknownItemError, supports_sessions

logger = logging.getLogger(__name__)

MAX_K = 1000
MAX_HISTORY = 100_000  # ids per history; the model reads only its last max_seq_len
MAX_BATCH = 1024  # histories per batch request
MAX_BODY_BYTES = 64 * 2**20  # a larger request body is refused (413)
MAX_PORT = 65535
MAX_SESSIONS = 10_000  # default; a one-layer d = 64 Mamba4Rec state is 17.5 KiB

ItemId = StrictStr | StrictInt
History = Annotated[list[ItemId], Field(max_length=MAX_HISTORY)]  # oldest first
Setting = StrictInt | float | StrictStr | bool | None


class _Ranking(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Strict: JSON's true is not k = 1, nor "no" a false exclude_seen.
    k: Annotated[StrictInt, Field(ge=1, le=MAX_K)] = 10
    exclude_seen: StrictBool = True


class _Request(_Ranking):
    settings: dict[str, Setting] = Field(default_factory=dict)


class RecommendRequest(_Request):
    history: History


class BatchRequest(_Request):
    histories: Annotated[list[History], Field(min_length=1, max_length=MAX_BATCH)]


class SessionStart(_Ranking):
    history: History


class SessionEvent(_Ranking):
    item: ItemId


SessionId = Annotated[str, Path(min_length=1, max_length=256)]


class RecommendResponse(BaseModel):
    items: list[str]
    scores: list[float] | None  # None for models that rank without scores (TIGER)
    unknown: list[str]  # history ids the model has never seen (ignored)


class BatchItem(RecommendResponse):
    error: str | None  # why this history got no recommendation


class BatchResponse(BaseModel):
    results: list[BatchItem]


class Health(BaseModel):
    status: str
    model: str
    num_items: int
    max_seq_len: int
    inference_settings: list[str]
    sessions: int | None  # sessions held; None when the model has no recurrent state


def create_app(
    predictor: Predictor, max_sessions: int = MAX_SESSIONS, max_body_bytes: int = MAX_BODY_BYTES
) -> FastAPI:
    """The app serving ``predictor``, with at most ``max_sessions`` sessions held when the
    model has a recurrent state; raises ``ValueError`` for a model that cannot serve
    histories (one that needs user ids)."""
    check_serves_histories(predictor.model)
    app = FastAPI(title="seqrec", summary="next-item recommendations from a trained run")
    app.router.route_class = _StrictJsonRoute
    app.add_middleware(_BodyLimit, max_bytes=max_body_bytes)
    store = SessionStore(predictor, max_sessions) if supports_sessions(predictor) else None

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, err: RequestValidationError) -> JSONResponse:
        # FastAPI's default answer also echoes each rejected value ("input"): a whole history at
        # worst, and raw bytes (a body sent as text/plain) that JSON cannot hold unless UTF-8.
        errors = [{key: value for key, value in e.items() if key != "input"} for e in err.errors()]
        content_type = request.headers.get("content-type", "")
        media = content_type.split(";")[0].strip().lower()
        about_body = any(error.get("loc", ("",))[0] == "body" for error in errors)
        if about_body and media and not media.endswith("json"):  # curl -d's form encoding
            errors.append(
                {
                    "loc": ["header", "content-type"],
                    "msg": f"the body is read as JSON only with Content-Type: application/json, "
                    f"not {content_type!r}",
                    "type": "content_type",
                }
            )
        return JSONResponse(status_code=422, content={"detail": jsonable_encoder(errors)})

    @app.exception_handler(ValueError)
    async def model_failure(request: Request, err: ValueError) -> JSONResponse:
        # What the model itself cannot do (scores that came out NaN): the request was fine, so
        # 500, but with the reason as JSON and one log line, not a bare 500 and a traceback.
        logger.error("%s %s: %s", request.method, request.url.path, err)
        return JSONResponse(status_code=500, content={"detail": str(err)})

    @app.get("/health")
    def health() -> Health:
        return Health(
            status="ok",
            model=predictor.model.config.name,
            num_items=len(predictor.id_map.items),
            max_seq_len=predictor.max_seq_len,
            inference_settings=list(predictor.inference_settings),
            sessions=None if store is None else len(store),
        )

    _add_recommend_routes(app, predictor)
    _add_session_routes(app, predictor, store)
    return app


def _add_recommend_routes(app: FastAPI, predictor: Predictor) -> None:
    limits = type(predictor.model.config).served_limits

    def answer(histories: list[list[ItemId]], request: _Request) -> list[Recommendation]:
        for name, value in request.settings.items():
            limit = limits.get(name)
            if limit is not None and isinstance(value, int) and value > limit:
                raise HTTPException(
                    status_code=422,
                    detail=f"settings.{name} {value} is above this server's limit of {limit} "
                    "(requests are answered one at a time); evaluate or recommend offline "
                    "for more",
                )
        try:
            return predictor.recommend(
                [[str(item) for item in history] for history in histories],
                request.k,
                request.exclude_seen,
                request.settings,
            )
        except ConfigError as err:
            raise HTTPException(status_code=400, detail=str(err)) from None

    @app.post("/recommend")
    def recommend(request: RecommendRequest) -> RecommendResponse:
        (result,) = answer([request.history], request)
        return _response(result, "cannot recommend")

    @app.post("/recommend/batch")
    def recommend_batch(request: BatchRequest) -> BatchResponse:
        results = answer(request.histories, request)
        return BatchResponse(
            results=[
                BatchItem(items=r.items, scores=r.scores, unknown=r.unknown, error=r.error)
                for r in results
            ]
        )


def _add_session_routes(app: FastAPI, predictor: Predictor, store: SessionStore | None) -> None:
    def sessions() -> SessionStore:
        if store is None:
            raise HTTPException(
                status_code=400,
                detail=f"{predictor.model.config.name} keeps no state per session (models that"
                " do, with init_state and step: gru4rec, mamba4rec); POST the whole history to "
                "/recommend",
            )
        return store

    @app.put("/sessions/{session_id}")
    def start_session(session_id: SessionId, request: SessionStart) -> RecommendResponse:
        history = [str(item) for item in request.history]
        result = sessions().start(session_id, history, request.k, request.exclude_seen)
        return _response(result, "cannot start")

    @app.post("/sessions/{session_id}/events")
    def add_event(session_id: SessionId, request: SessionEvent) -> RecommendResponse:
        held = sessions()
        try:
            result = held.append(session_id, str(request.item), request.k, request.exclude_seen)
        except KeyError:
            raise HTTPException(status_code=404, detail=_no_session(session_id)) from None
        except UnknownItemError as err:
            raise HTTPException(status_code=422, detail=str(err)) from None
        return _response(result, "cannot recommend")

    @app.delete("/sessions/{session_id}", status_code=204)
    def end_session(session_id: SessionId) -> Response:
        if not sessions().end(session_id):
            raise HTTPException(status_code=404, detail=_no_session(session_id))
        return Response(status_code=204)


def _response(result: Recommendation, failure: str) -> RecommendResponse:
    """The answer to one history; 422 with the unknown ids when there is none."""
    if result.error is not None:
        raise HTTPException(
            status_code=422,
            detail={"error": f"{failure}: {result.error}", "unknown": result.unknown},
        )
    return RecommendResponse(items=result.items, scores=result.scores, unknown=result.unknown)


class _BodyLimit:
    """ASGI middleware: 413 for a request body over ``max_bytes``, unread when its Content-Length
    says so, and otherwise (a chunked body) as soon as what arrived passes the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(f"request body of {declared} bytes", scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._refuse(f"request body of at least {size} bytes", scope, receive, send)
                return
            more = message.get("more_body", False)
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:  # after the body: wait for the disconnect, as the server would
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, what: str, scope: Scope, receive: Receive, send: Send) -> None:
        detail = f"{what}; the limit is {self.max_bytes}"
        await JSONResponse(status_code=413, content={"detail": detail})(scope, receive, send)


class _StrictJsonRequest(Request):
    """A request whose JSON body holds only finite numbers and strings without lone surrogates.

    Python's ``json`` reads NaN, Infinity, 1e400 (as inf) and "\\ud800", but no response can
    render them, so a request echoing one (a validation error, an unknown id) would fail with 500.
    """

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            try:
                parsed = json.loads(
                    await self.body(), parse_constant=_no_constant, parse_float=_finite_float
                )
            except json.JSONDecodeError:
                raise  # FastAPI answers 422 with the position
            except ValueError as err:  # also not UTF-8, or an int of over 4300 digits
                raise HTTPException(400, f"cannot read the JSON body: {err}") from None
            except RecursionError:
                raise HTTPException(
                    400, "cannot read the JSON body: its arrays or objects nest too deeply"
                ) from None
            if any(_LONE_SURROGATE.search(text) for text in _strings(parsed)):
                raise HTTPException(
                    400,
                    "cannot read the JSON body: a string holds a lone UTF-16 surrogate (half a"
                    " character, as from a cut emoji)",
                )
            self._json = parsed
        return self._json


class _StrictJsonRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            return await handler(_StrictJsonRequest(request.scope, request.receive))

        return strict_handler


# json joins an escaped pair such as "\ud83d\ude00" into one character: any surrogate left is lone
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number (beyond a float's range)")
    return value


def _strings(value: Any) -> Iterator[str]:
    """Every string in parsed JSON, object keys included (without recursion: the client chose
    the depth)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item)
            pending.extend(item.values())


def _no_session(session_id: str) -> str:
    return (
        f"no session {session_id!r} (never started, ended, or dropped as the least recently "
        f"used); PUT /sessions/{session_id} with the history to start it"
    )


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0: any free port), so that the address is known before
    the server starts."""
    if not 0 <= port <= MAX_PORT:  # socket.bind raises OverflowError, which is no OSError
        raise ConfigError(f"cannot listen on {host}:{port}: the port must be 0-{MAX_PORT}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    sock.listen(128)
    return sock


def serve(app: FastAPI, sock: socket.socket) -> None:
    """Serve ``app`` on ``sock`` until SIGINT or SIGTERM (uvicorn, one worker)."""
    import uvicorn

    config = uvicorn.Config(app, log_level="info", access_log=False)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        # uvicorn shuts down cleanly, then raises again the SIGINT or SIGTERM it caught: SIGINT
        # arrives as KeyboardInterrupt, SIGTERM as the CLI's subclass of it (cli._Terminated)
        logger.info("stopped")
