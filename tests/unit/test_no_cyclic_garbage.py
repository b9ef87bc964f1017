"""A request leaves no cyclic garbage behind on any path, on either shell: the cyclic GC never
has to run because of us (a full collection under load is a latency spike)."""

from __future__ import annotations

import asyncio
import gc
import io
import itertools
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from retrysafe.asgi import IdempotencyMiddleware as ASGIMiddleware
from retrysafe.stores import AsyncMemoryStore, MemoryStore
from retrysafe.wsgi import IdempotencyMiddleware as WSGIMiddleware

BODY = b'{"item":"book","quantity":1}'
N = 2000
counter = itertools.count()
KEYS: dict[str, Callable[[], str | None]] = {
    "new key": lambda: f'"k-{next(counter)}"',
    "replay": lambda: '"same"',
    "no key": lambda: None,
}


async def _order(request: Request) -> JSONResponse:
    data = await request.json()
    return JSONResponse(data, status_code=201, headers={"Location": "/orders/1"})


def _wsgi_order(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    body = environ["wsgi.input"].read()
    start_response("201 Created", [("Content-Type", "application/json")])
    return [body]


def _collected_per_request(
    run_one: Callable[[str | None], None], keys: Callable[[], str | None]
) -> float:
    run_one(keys())  # warm up: first reservation, caches
    gc.collect()
    gc.disable()
    try:
        for _ in range(N):
            run_one(keys())
        return gc.collect() / N
    finally:
        gc.enable()


@pytest.mark.parametrize("path", list(KEYS))
def test_the_asgi_shell_leaves_no_cyclic_garbage(path: str) -> None:
    app = ASGIMiddleware(
        Starlette(routes=[Route("/orders", _order, methods=["POST"])]),
        store=AsyncMemoryStore(),
        detach_handler="never",
    )
    loop = asyncio.new_event_loop()
    message = {"type": "http.request", "body": BODY, "more_body": False}

    async def receive() -> dict[str, Any]:
        return message

    async def send(_: Any) -> None:
        return None

    def run_one(key: str | None) -> None:
        headers = [(b"content-type", b"application/json")]
        if key is not None:
            headers.append((b"idempotency-key", key.encode()))
        scope = {"type": "http", "method": "POST", "path": "/orders", "headers": headers}
        loop.run_until_complete(app(scope, receive, send))

    try:
        assert _collected_per_request(run_one, KEYS[path]) == 0
    finally:
        loop.close()


@pytest.mark.parametrize("path", list(KEYS))
def test_the_wsgi_shell_leaves_no_cyclic_garbage(path: str) -> None:
    app = WSGIMiddleware(_wsgi_order, store=MemoryStore())

    def run_one(key: str | None) -> None:
        environ: dict[str, Any] = {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": "/orders",
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(BODY)),
            "wsgi.input": io.BytesIO(BODY),
        }
        if key is not None:
            environ["HTTP_IDEMPOTENCY_KEY"] = key
        result = app(environ, lambda status, headers, exc_info=None: None)
        for _ in result:
            pass
        close = getattr(result, "close", None)
        if close is not None:
            close()

    assert _collected_per_request(run_one, KEYS[path]) == 0
