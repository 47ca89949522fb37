"""Online serving over HTTP: a FastAPI app around ``Predictor`` (extra ``serve``).

    GET  /health            the loaded model: name, catalogue size, inference settings
    POST /recommend         {"history": ["1193", "661"], "k": 10} -> {"items", "scores", "unknown"}
    POST /recommend/batch   {"histories": [[...], ...], "k": 10} -> {"results": [...]}

Item ids are the original ids of the training log, as strings (numbers are accepted and read
as their decimal text). Both POSTs take ``exclude_seen`` (default true) and ``settings``, the
model's inference settings for this request only (``{"depth": 2}`` for RecRec, ``{"beam_size":
20}`` for TIGER). The server is stateless: each request carries the whole history.

Errors are JSON ``{"detail": ...}``: 422 for a malformed body (FastAPI's field-by-field
list), 400 for settings the model does not have, 422 with the unknown ids for a single history
with no known item. In a batch, such a history gets its own ``error`` and the rest are answered.
"""

from __future__ import annotations

import logging
import socket
from typing import Annotated

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from seqrec.config import ConfigError
from seqrec.serving.predictor import Predictor, Recommendation

logger = logging.getLogger(__name__)

MAX_K = 1000
MAX_HISTORY = 100_000  # ids per history; the model reads only its last max_seq_len
MAX_BATCH = 1024  # histories per batch request

ItemId = StrictStr | StrictInt
Setting = StrictInt | float | StrictStr | bool | None


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    k: Annotated[int, Field(ge=1, le=MAX_K)] = 10
    exclude_seen: bool = True
    settings: dict[str, Setting] = Field(default_factory=dict)


class RecommendRequest(_Request):
    history: Annotated[list[ItemId], Field(max_length=MAX_HISTORY)]


class BatchRequest(_Request):
    histories: Annotated[
        list[Annotated[list[ItemId], Field(max_length=MAX_HISTORY)]],
        Field(min_length=1, max_length=MAX_BATCH),
    ]


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


def create_app(predictor: Predictor) -> FastAPI:
    """The app serving ``predictor``; raises ``ValueError`` for a model that cannot serve
    histories (one that needs user ids)."""
    if predictor.model.uses_users:
        raise ValueError("this model needs user ids (a user embedding); it cannot serve histories")
    app = FastAPI(title="seqrec", summary="next-item recommendations from a trained run")

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

    @app.get("/health")
    def health() -> Health:
        return Health(
            status="ok",
            model=predictor.model.config.name,
            num_items=len(predictor.id_map.items),
            max_seq_len=predictor.max_seq_len,
            inference_settings=list(predictor.inference_settings),
        )

    @app.post("/recommend")
    def recommend(request: RecommendRequest) -> RecommendResponse:
        (result,) = answer([request.history], request)
        if result.error is not None:
            raise HTTPException(
                status_code=422,
                detail={"error": f"cannot recommend: {result.error}", "unknown": result.unknown},
            )
        return RecommendResponse(items=result.items, scores=result.scores, unknown=result.unknown)

    @app.post("/recommend/batch")
    def recommend_batch(request: BatchRequest) -> BatchResponse:
        results = answer(request.histories, request)
        return BatchResponse(
            results=[
                BatchItem(items=r.items, scores=r.scores, unknown=r.unknown, error=r.error)
                for r in results
            ]
        )

    return app


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
