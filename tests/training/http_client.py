"""A real HTTP round trip for the serving tests: an app on a local socket, and a client."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI

from seqrec.serving.http import bind


@contextmanager
def served(app: FastAPI) -> Iterator[str]:
    """The base URL of ``app`` served by uvicorn on a free local port, in a thread."""
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def call(
    base: str, path: str, body: Any = None, raw: bytes | None = None, method: str | None = None
) -> tuple[int, Any]:
    """(status, decoded JSON or None) of a GET (no body), a POST, or ``method``."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        base + path, data=data, headers={"Content-Type": "application/json"}, method=method
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            content = response.read()
            return response.status, json.loads(content) if content else None
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
