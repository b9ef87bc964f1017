"""Helpers shared by the in-process integration tests: clients, counters and a raw ASGI driver."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from retrysafe.stores import AsyncMemoryStore, AsyncSQLiteStore, AsyncStore

REPLAYED = "idempotency-replayed"


def client_for(app: Any) -> httpx.AsyncClient:
    """An in-process client; app exceptions become 500s as a server would answer."""
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://test")


def key(value: str = "key-1") -> dict[str, str]:
    """Headers carrying an sf-string Idempotency-Key."""
    return {"Idempotency-Key": f'"{value}"'}


def problem_type(response: httpx.Response) -> str:
    """The RFC 9457 type of an error response (asserting it is problem+json)."""
    assert response.headers["content-type"] == "application/problem+json"
    data = json.loads(response.content)
    assert data["status"] == response.status_code
    assert data["title"] and data["detail"]
    value: str = data["type"]
    return value.rsplit(":", 1)[-1]


def make_store(kind: str, tmp_path: Any, **kwargs: Any) -> AsyncStore:
    """A real store of the given kind ("memory" or "sqlite")."""
    if kind == "memory":
        return AsyncMemoryStore(**kwargs)
    return AsyncSQLiteStore(f"{tmp_path}/idempotency.db", **kwargs)


@dataclass
class Calls:
    """How often each handler ran."""

    counts: Counter[str] = field(default_factory=Counter)

    def hit(self, name: str) -> int:
        self.counts[name] += 1
        return self.counts[name]

    def __getitem__(self, name: str) -> int:
        return self.counts[name]


def http_scope(
    method: str = "POST",
    path: str = "/orders",
    headers: Iterable[tuple[bytes, bytes]] = (),
    *,
    spec_version: str = "2.3",
) -> dict[str, Any]:
    """An ASGI http scope as a server (uvicorn: spec 2.3) builds it."""
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": spec_version},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"test"), *headers],
        "server": ("test", 80),
        "client": ("127.0.0.1", 50000),
    }


Receive = Callable[[], Awaitable[dict[str, Any]]]


def body_then(body: bytes, after: str = "block") -> Receive:
    """A receive that gives ``body`` and then blocks ("block") or reports a disconnect."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        if after == "disconnect":
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    return receive


async def drive(
    app: Any, scope: dict[str, Any], receive: Receive, *, fail_send: bool = False
) -> list[dict[str, Any]]:
    """Call an ASGI app; return the messages it sent. ``fail_send``: every send raises OSError,
    as a server's send does once the client has gone."""
    messages: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)
        if fail_send:
            raise OSError("client disconnected")

    await app(scope, receive, send)
    return messages
