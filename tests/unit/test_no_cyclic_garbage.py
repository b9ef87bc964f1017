"""A request leaves no cyclic garbage behind on any path, on either shell: the cyclic GC never
has to run because of us (a full collection under load is a latency spike).

Each case is measured in a fresh interpreter (this file run as a script): ``gc.collect()``
counts what every thread of the process left, and a test worker keeps the threads and loops of
the tests it ran before (lease sweepers, clients' threads), which would be counted as ours.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import io
import itertools
import json
import subprocess
import sys
from collections.abc import Callable, Iterable
from typing import Any

import pytest

BODY = b'{"item":"book","quantity":1}'
N = 2000
counter = itertools.count()
KEYS: dict[str, Callable[[], str | None]] = {
    "new key": lambda: f'"k-{next(counter)}"',
    "replay": lambda: '"same"',
    "no key": lambda: None,
}


def _collected_per_request(
    run_one: Callable[[str | None], None], keys: Callable[[], str | None]
) -> tuple[float, dict[str, int]]:
    """Garbage the cyclic collector found after N requests, per request, and its types."""
    run_one(keys())  # warm up: first reservation, caches
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # keep what it finds, to name it
    try:
        for _ in range(N):
            run_one(keys())
        found = gc.collect()
        kinds = collections.Counter(type(o).__qualname__ for o in gc.garbage)
        return found / N, dict(kinds.most_common(8))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def _asgi(path: str) -> tuple[float, dict[str, int]]:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from retrysafe.asgi import IdempotencyMiddleware
    from retrysafe.stores import AsyncMemoryStore

    async def order(request: Request) -> JSONResponse:
        data = await request.json()
        return JSONResponse(data, status_code=201, headers={"Location": "/orders/1"})

    app = IdempotencyMiddleware(
        Starlette(routes=[Route("/orders", order, methods=["POST"])]),
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
        return _collected_per_request(run_one, KEYS[path])
    finally:
        loop.close()


def _wsgi(path: str) -> tuple[float, dict[str, int]]:
    from retrysafe.stores import MemoryStore
    from retrysafe.wsgi import IdempotencyMiddleware

    def order(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        body = environ["wsgi.input"].read()
        start_response("201 Created", [("Content-Type", "application/json")])
        return [body]

    app = IdempotencyMiddleware(order, store=MemoryStore())

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

    return _collected_per_request(run_one, KEYS[path])


SHELLS = {"asgi": _asgi, "wsgi": _wsgi}


@pytest.mark.parametrize("shell", list(SHELLS))
@pytest.mark.parametrize("path", list(KEYS))
def test_a_request_leaves_no_cyclic_garbage(shell: str, path: str) -> None:
    child = subprocess.run(
        [sys.executable, __file__, shell, path], capture_output=True, text=True, timeout=300
    )
    assert child.returncode == 0, child.stderr[-4000:]
    per_request, kinds = json.loads(child.stdout)
    assert per_request == 0, f"{per_request} objects per request: {kinds}"


if __name__ == "__main__":
    print(json.dumps(SHELLS[sys.argv[1]](sys.argv[2])))
