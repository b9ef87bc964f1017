"""detach_handler: the handler runs in its own task except under uvicorn (which never cancels a
request), and a cancelled request's handler still finishes and is stored when detached."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from retrysafe.asgi import IdempotencyMiddleware
from retrysafe.stores import AsyncMemoryStore

BODY = b"{}"


def _scope() -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/orders",
        "query_string": b"",
        "headers": [(b"idempotency-key", b"k1")],
    }


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": BODY, "more_body": False}


class _Sink:
    """A server's request cycle: its bound receive tells uvicorn apart."""

    async def receive(self) -> dict[str, Any]:
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(self, message: dict[str, Any]) -> None:
        pass


_UvicornCycle = type("RequestResponseCycle", (_Sink,), {"__module__": "uvicorn.protocols.http.x"})


async def _handler_task(mode: str, sink: _Sink) -> bool:
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen["task"] = asyncio.current_task()
        await receive()
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    middleware = IdempotencyMiddleware(app, store=AsyncMemoryStore(), detach_handler=mode)

    async def wrapped_send(message: dict[str, Any]) -> None:  # as Starlette wraps send
        await sink.send(message)

    await middleware(_scope(), sink.receive, wrapped_send)
    return bool(seen["task"] is not asyncio.current_task())


@pytest.mark.parametrize(
    ("mode", "sink", "detached"),
    [
        pytest.param("auto", _UvicornCycle(), False, id="auto-uvicorn"),
        pytest.param("auto", _Sink(), True, id="auto-other-server"),
        pytest.param("always", _UvicornCycle(), True, id="always"),
        pytest.param("never", _Sink(), False, id="never"),
    ],
)
async def test_handler_runs_detached_only_where_needed(
    mode: str, sink: _Sink, detached: bool
) -> None:
    assert await _handler_task(mode, sink) is detached


async def test_detached_handler_outlives_a_cancelled_request_and_is_stored() -> None:
    store = AsyncMemoryStore()
    release = asyncio.Event()
    started = asyncio.Event()
    runs = {"n": 0}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        runs["n"] += 1
        started.set()
        await release.wait()
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})

    middleware = IdempotencyMiddleware(app, store=store, detach_handler="always")
    request = asyncio.create_task(middleware(_scope(), _receive, _Sink().send))
    await started.wait()
    request.cancel()  # the server gave up on the request: its client disconnected
    with pytest.raises(asyncio.CancelledError):
        await request
    release.set()
    for _ in range(100):
        record = next(iter(store.sync._entries.values()))
        if record.response is not None:
            break
        await asyncio.sleep(0.01)
    assert record.response is not None  # the answer the client missed is kept for its retry
    assert runs["n"] == 1
