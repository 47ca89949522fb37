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
list), 400 for settings the model does not have, 422 with the unknown ids for a single history
with no known item, 413 for a body declared larger than 64 MiB. In a batch, a history with no
known item gets its own ``error`` and the rest are answered. A session not held (never
started, ended, or dropped as the least recently used beyond the capacity) is 404; an event
with an item outside the catalogue is 422 and leaves the session unchanged; sessions on a
model without a recurrent state are 400.
"""

from __future__ import annotations

import logging
import socket
from typing import Annotated, Any

from fastapi import FastAPI, HTTPException, Path, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from seqrec.config import ConfigError
from seqrec.serving.predictor import Predictor, Recommendation
from seqrec.serving.sessions import SessionStore, supports_sessions

logger = logging.getLogger(__name__)

MAX_K = 1000
MAX_HISTORY = 100_000  # ids per history; the model reads only its last max_seq_len
MAX_BATCH = 1024  # histories per batch request
MAX_BODY_BYTES = 64 * 2**20  # a request declaring a larger body is refused (413) unread
MAX_SESSIONS = 10_000  # default; a one-layer d = 64 Mamba4Rec state is 17.5 KiB

ItemId = StrictStr | StrictInt
History = Annotated[list[ItemId], Field(max_length=MAX_HISTORY)]  # oldest first
Setting = StrictInt | float | StrictStr | bool | None


class _Ranking(BaseModel):
    model_config = ConfigDict(extra="forbid")

    k: Annotated[int, Field(ge=1, le=MAX_K)] = 10
    exclude_seen: bool = True


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
    if predictor.model.uses_users:
        raise ValueError("this model needs user ids (a user embedding); it cannot serve histories")
    app = FastAPI(title="seqrec", summary="next-item recommendations from a trained run")
    store = SessionStore(predictor, max_sessions) if supports_sessions(predictor) else None

    @app.middleware("http")
    async def refuse_large_bodies(request: Request, call_next: Any) -> Any:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_body_bytes:
            detail = f"request body of {declared} bytes; the limit is {max_body_bytes}"
            return JSONResponse(status_code=413, content={"detail": detail})
        return await call_next(request)

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
    def answer(histories: list[list[ItemId]], request: _Request) -> list[Recommendation]:
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
                " do: gru4rec, mamba4rec); POST the whole history to /recommend",
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
        except ValueError as err:
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


def _no_session(session_id: str) -> str:
    return (
        f"no session {session_id!r} (never started, ended, or dropped as the least recently "
        f"used); PUT /sessions/{session_id} with the history to start it"
    )


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0: any free port), so that the address is known before
    the server starts."""
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
    except KeyboardInterrupt:  # uvicorn shuts down cleanly, then re-raises the SIGINT it caught
        logger.info("stopped")
