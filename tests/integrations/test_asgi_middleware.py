"""retrysafe.asgi.IdempotencyMiddleware in real Starlette apps, driven in-process: what only
the ASGI shell does.

The wire contract itself (every row of DESIGN section 2, the status policy, replayed headers,
scoping, leases, fencing, lost responses, bad input) is proven once for every shell and store by
``tests/contract/``. What stays here is ASGI- or Starlette-specific: per-route settings through
``@idempotent`` routes, the Starlette authenticated user as scope, the framing of a replayed
stream, non-HTTP scopes, the handler detached from a cancelled request, and store doubles that
fail in ways a real store cannot be made to on demand (a store that corrupts a record).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from retrysafe import idempotent
from retrysafe.asgi import IdempotencyMiddleware
from retrysafe.stores import AsyncMemoryStore, AsyncStore

from .helpers import (
    REPLAYED,
    Calls,
    body_then,
    client_for,
    drive,
    http_scope,
    key,
    make_store,
    problem_type,
)

ORDER = {"item": "book", "quantity": 2}


@dataclass
class Gate:
    """Holds a handler until the test opens it."""

    entered: asyncio.Event = field(default_factory=asyncio.Event)
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)


def build_app(
    store: AsyncStore,
    calls: Calls,
    gate: Gate | None = None,
    *,
    outer: list[Middleware] | None = None,
    **options: Any,
) -> Starlette:
    """A small orders API behind the idempotency middleware."""
    gate = gate or Gate()

    async def create_order(request: Request) -> Response:
        n = calls.hit("orders")
        body = await request.body()
        return JSONResponse(
            {"call": n, "sha": hashlib.sha256(body).hexdigest(), "user": _who(request)},
            status_code=201,
            headers={
                "Location": f"/orders/{n}",
                "ETag": f'"v{n}"',
                "Set-Cookie": f"session={n}",
                "X-Custom": f"c{n}",
                "Cache-Control": "no-store",
            },
        )

    async def slow(request: Request) -> Response:
        n = calls.hit("slow")
        gate.entered.set()
        await gate.opened.wait()
        gate.finished.set()
        return JSONResponse({"call": n}, status_code=201, headers={"Location": f"/slow/{n}"})

    async def stream(request: Request) -> Response:
        n = calls.hit("stream")

        async def chunks() -> AsyncIterator[bytes]:
            for i in range(5):
                await asyncio.sleep(0)
                yield f"chunk-{n}-{i};".encode()

        return StreamingResponse(chunks(), status_code=201, media_type="text/plain")

    @idempotent(required=True)
    async def required_route(request: Request) -> Response:
        n = calls.hit("required")
        return JSONResponse({"call": n}, status_code=201)

    @idempotent(enabled=False)
    async def opted_out(request: Request) -> Response:
        n = calls.hit("optout")
        return JSONResponse({"call": n}, status_code=201)

    @idempotent(on_conflict="wait")
    async def waiting(request: Request) -> Response:
        return await slow(request)

    routes = [
        Route("/orders", create_order, methods=["POST", "PATCH", "PUT"]),
        Route("/slow", slow, methods=["POST"]),
        Route("/stream", stream, methods=["POST"]),
        Route("/required", required_route, methods=["POST"]),
        Route("/optout", opted_out, methods=["POST"]),
        Route("/waiting", waiting, methods=["POST"]),
    ]
    # Starlette's ParamSpec-typed Middleware cannot match a constructor that takes **options.
    idem = Middleware(IdempotencyMiddleware, store=store, **options)  # type: ignore[arg-type]
    middleware = [*(outer or []), idem]
    return Starlette(routes=routes, middleware=middleware)


def _who(request: Request) -> str | None:
    user = request.scope.get("user")
    return getattr(user, "username", None)


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AsyncStore]:
    made = make_store(request.param, tmp_path)
    yield made
    await made.aclose()


@pytest.fixture
def calls() -> Calls:
    return Calls()


async def post_order(client: httpx.AsyncClient, k: str = "key-1", **kw: Any) -> httpx.Response:
    kw.setdefault("json", ORDER)
    return await client.post("/orders", headers=key(k), **kw)


# -- per-route settings -------------------------------------------------------------------------


async def test_per_route_on_conflict_wait_overrides_reject(store: AsyncStore, calls: Calls) -> None:
    gate = Gate()
    async with client_for(build_app(store, calls, gate)) as client:
        first = asyncio.create_task(client.post("/waiting", headers=key()))
        await gate.entered.wait()
        waiting = asyncio.create_task(client.post("/waiting", headers=key()))
        await asyncio.sleep(0.05)
        gate.opened.set()
        done, replay = await first, await waiting
    assert replay.headers[REPLAYED] == "true"
    assert replay.content == done.content
    assert calls["slow"] == 1


async def test_missing_key_is_400_on_a_route_marked_required(
    store: AsyncStore, calls: Calls
) -> None:
    async with client_for(build_app(store, calls)) as client:
        missing = await client.post("/required", json=ORDER)
        optional = await client.post("/orders", json=ORDER)
        first = await client.post("/required", json=ORDER, headers=key())
        replay = await client.post("/required", json=ORDER, headers=key())
    assert missing.status_code == 400
    assert problem_type(missing) == "idempotency-key-missing"
    assert optional.status_code == 201
    assert first.status_code == 201
    assert replay.headers[REPLAYED] == "true"
    assert calls["required"] == 1


# -- what is stored and replayed ------------------------------------------------------------


async def test_streaming_response_is_captured_entirely_and_replayed_as_one_body(
    store: AsyncStore, calls: Calls
) -> None:
    app = build_app(store, calls)
    async with client_for(app) as client:
        first = await client.post("/stream", headers=key())
    expected = b"".join(f"chunk-1-{i};".encode() for i in range(5))
    assert first.content == expected
    messages = await drive(
        app,
        http_scope("POST", "/stream", [(b"idempotency-key", b'"key-1"')]),
        body_then(b""),
    )
    bodies = [m for m in messages if m["type"] == "http.response.body"]
    assert len(bodies) == 1
    assert bodies[0]["body"] == expected
    assert bodies[0].get("more_body", False) is False
    assert (REPLAYED.encode(), b"true") in messages[0]["headers"]
    assert calls["stream"] == 1


async def test_corrupt_stored_response_is_a_503_problem_not_a_500(calls: Calls) -> None:
    class CorruptStore(AsyncMemoryStore):
        async def complete(
            self, record_id: str, token: str, response: bytes, *, ttl: float
        ) -> bool:
            return await super().complete(record_id, token, response[:-3], ttl=ttl)

    async with client_for(build_app(CorruptStore(), calls)) as client:
        await post_order(client)
        replay = await post_order(client)
    assert replay.status_code == 503
    assert problem_type(replay) == "idempotency-store-unavailable"
    assert calls["orders"] == 1


# -- scoping (guarantee 6) ------------------------------------------------------------------------


class TokenBackend(AuthenticationBackend):
    """``Authorization: Token <user>:<session>``: one user, many session tokens."""

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, SimpleUser] | None:
        header = conn.headers.get("authorization", "")
        if not header.startswith("Token "):
            return None
        username = header.removeprefix("Token ").split(":")[0]
        return AuthCredentials(["authenticated"]), SimpleUser(username)


async def test_keys_are_scoped_by_the_authenticated_starlette_user(
    store: AsyncStore, calls: Calls
) -> None:
    outer = [Middleware(AuthenticationMiddleware, backend=TokenBackend())]
    app = build_app(store, calls, outer=outer)

    def as_(auth: str) -> dict[str, str]:
        return {**key(), "Authorization": f"Token {auth}"}

    async with client_for(app) as client:
        alice = await client.post("/orders", json=ORDER, headers=as_("alice:session-1"))
        # Same user on another session token: the principal, not the header, is the scope.
        alice_again = await client.post("/orders", json=ORDER, headers=as_("alice:session-2"))
        bob = await client.post("/orders", json=ORDER, headers=as_("bob:session-3"))
    assert alice.json()["user"] == "alice"
    assert alice_again.headers[REPLAYED] == "true"
    assert alice_again.content == alice.content
    assert bob.json()["user"] == "bob"
    assert REPLAYED not in bob.headers
    assert calls["orders"] == 2


# -- what the middleware leaves alone -----------------------------------------------------------


async def test_route_marked_enabled_false_is_not_protected(store: AsyncStore, calls: Calls) -> None:
    async with client_for(build_app(store, calls, required=True)) as client:
        no_key = await client.post("/optout", json=ORDER)
        keyed = await client.post("/optout", json=ORDER, headers=key())
        keyed_again = await client.post("/optout", json=ORDER, headers=key())
    assert no_key.status_code == keyed.status_code == keyed_again.status_code == 201
    assert REPLAYED not in keyed_again.headers
    assert calls["optout"] == 3


@pytest.mark.parametrize("kind", ["lifespan", "websocket"])
async def test_non_http_scopes_pass_straight_through(kind: str) -> None:
    seen: list[tuple[Any, Any, Any]] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        seen.append((scope, receive, send))

    mw = IdempotencyMiddleware(inner, store="memory://", required=True)
    scope = {"type": kind, "asgi": {"version": "3.0"}, "path": "/ws", "headers": []}

    async def receive() -> dict[str, Any]:
        return {"type": f"{kind}.startup" if kind == "lifespan" else "websocket.connect"}

    async def send(message: Any) -> None: ...

    await mw(scope, receive, send)
    assert seen == [(scope, receive, send)]


# -- leases, fencing and lost responses (guarantees 2-4) ------------------------------------------


async def test_handler_keeps_running_after_the_client_task_is_cancelled(
    store: AsyncStore, calls: Calls
) -> None:
    gate = Gate()
    async with client_for(build_app(store, calls, gate)) as client:
        request = asyncio.create_task(client.post("/slow", headers=key()))
        await gate.entered.wait()
        request.cancel()  # the client gives up (a timeout, a closed tab)
        with pytest.raises(asyncio.CancelledError):
            await request
        gate.opened.set()
        await asyncio.wait_for(gate.finished.wait(), 2)
        for _ in range(100):
            retry = await client.post("/slow", headers=key())
            if retry.status_code != 409:
                break
            await asyncio.sleep(0.01)
    assert retry.status_code == 201
    assert retry.headers[REPLAYED] == "true"
    assert calls["slow"] == 1
