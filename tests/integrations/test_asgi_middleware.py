"""retrysafe.asgi.IdempotencyMiddleware in real Starlette apps, driven in-process.

One test (at least) per row of the wire contract (DESIGN section 2), then the status policy,
header filtering, streaming, scoping, per-route settings and guarantees 2-4 of section 3.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
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

import retrysafe
from retrysafe import StoreUnavailableError, idempotent
from retrysafe.asgi import IdempotencyMiddleware
from retrysafe.stores import AsyncMemoryStore, AsyncStore

from ..clock import FakeClock
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

    async def with_status(request: Request) -> Response:
        n = calls.hit("status")
        return JSONResponse({"call": n}, status_code=int(request.path_params["code"]))

    async def slow(request: Request) -> Response:
        n = calls.hit("slow")
        gate.entered.set()
        await gate.opened.wait()
        gate.finished.set()
        return JSONResponse({"call": n}, status_code=201, headers={"Location": f"/slow/{n}"})

    async def sleepy(request: Request) -> Response:
        n = calls.hit("sleepy")
        await asyncio.sleep(float(request.query_params["s"]))
        return JSONResponse({"call": n}, status_code=201)

    async def flaky(request: Request) -> Response:
        n = calls.hit("flaky")
        if n == 1:
            raise RuntimeError("the first attempt fails")
        return JSONResponse({"call": n}, status_code=201)

    async def stream(request: Request) -> Response:
        n = calls.hit("stream")

        async def chunks() -> AsyncIterator[bytes]:
            for i in range(5):
                await asyncio.sleep(0)
                yield f"chunk-{n}-{i};".encode()

        return StreamingResponse(chunks(), status_code=201, media_type="text/plain")

    async def big(request: Request) -> Response:
        n = calls.hit("big")
        return Response(b"x" * 5000, status_code=201, headers={"Location": f"/big/{n}"})

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

    async def list_orders(request: Request) -> Response:
        n = calls.hit("list")
        return JSONResponse({"call": n})

    routes = [
        Route("/orders", create_order, methods=["POST", "PATCH", "PUT"]),
        Route("/orders", list_orders, methods=["GET"]),
        Route("/status/{code:int}", with_status, methods=["POST"]),
        Route("/slow", slow, methods=["POST"]),
        Route("/sleepy", sleepy, methods=["POST"]),
        Route("/flaky", flaky, methods=["POST"]),
        Route("/stream", stream, methods=["POST"]),
        Route("/big", big, methods=["POST"]),
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


# -- the wire contract, row by row ---------------------------------------------------------------


async def test_first_request_passes_through_unchanged(store: AsyncStore, calls: Calls) -> None:
    async with client_for(build_app(store, calls)) as client:
        response = await post_order(client)
    assert response.status_code == 201
    assert response.json()["call"] == 1
    assert response.headers["location"] == "/orders/1"
    assert response.headers["set-cookie"] == "session=1"
    assert REPLAYED not in response.headers
    assert calls["orders"] == 1


async def test_retry_replays_byte_for_byte_without_running_the_handler(
    store: AsyncStore, calls: Calls
) -> None:
    async with client_for(build_app(store, calls)) as client:
        first = await post_order(client)
        second = await post_order(client)
        third = await post_order(client)
    assert calls["orders"] == 1
    for replay in (second, third):
        assert replay.status_code == 201
        assert replay.content == first.content
        for name in ("location", "content-type", "etag", "x-custom", "cache-control"):
            assert replay.headers[name] == first.headers[name]
        assert replay.headers[REPLAYED] == "true"


async def test_quoted_and_bare_key_address_the_same_record(store: AsyncStore, calls: Calls) -> None:
    async with client_for(build_app(store, calls)) as client:
        first = await client.post("/orders", json=ORDER, headers={"Idempotency-Key": '"k-7"'})
        second = await client.post("/orders", json=ORDER, headers={"Idempotency-Key": "k-7"})
    assert second.headers[REPLAYED] == "true"
    assert second.content == first.content
    assert calls["orders"] == 1


async def test_different_keys_each_run(store: AsyncStore, calls: Calls) -> None:
    async with client_for(build_app(store, calls)) as client:
        a = await post_order(client, "a")
        b = await post_order(client, "b")
    assert (a.json()["call"], b.json()["call"]) == (1, 2)


async def test_409_with_retry_after_while_the_first_request_runs(
    store: AsyncStore, calls: Calls
) -> None:
    gate = Gate()
    async with client_for(build_app(store, calls, gate, lease=20.0)) as client:
        first = asyncio.create_task(client.post("/slow", headers=key()))
        await gate.entered.wait()
        conflict = await client.post("/slow", headers=key())
        gate.opened.set()
        done = await first
        replay = await client.post("/slow", headers=key())
    assert conflict.status_code == 409
    assert problem_type(conflict) == "idempotency-request-in-progress"
    assert 1 <= int(conflict.headers["retry-after"]) <= 20
    assert done.status_code == 201
    assert replay.headers[REPLAYED] == "true"
    assert replay.content == done.content
    assert calls["slow"] == 1


async def test_on_conflict_wait_replays_the_first_response_when_it_finishes(
    store: AsyncStore, calls: Calls
) -> None:
    gate = Gate()
    async with client_for(build_app(store, calls, gate, on_conflict="wait")) as client:
        first = asyncio.create_task(client.post("/slow", headers=key()))
        await gate.entered.wait()
        waiting = asyncio.create_task(client.post("/slow", headers=key()))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        gate.opened.set()
        done, replay = await first, await waiting
    assert replay.status_code == 201
    assert replay.headers[REPLAYED] == "true"
    assert replay.content == done.content
    assert replay.headers["location"] == "/slow/1"
    assert calls["slow"] == 1


async def test_on_conflict_wait_gives_409_after_conflict_wait(
    store: AsyncStore, calls: Calls
) -> None:
    gate = Gate()
    app = build_app(store, calls, gate, on_conflict="wait", conflict_wait=0.1)
    async with client_for(app) as client:
        first = asyncio.create_task(client.post("/slow", headers=key()))
        await gate.entered.wait()
        conflict = await client.post("/slow", headers=key())
        gate.opened.set()
        await first
    assert conflict.status_code == 409
    assert "retry-after" in conflict.headers
    assert calls["slow"] == 1


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


@pytest.mark.parametrize(
    "change",
    [
        {"json": {"item": "book", "quantity": 3}},
        {"params": {"coupon": "x"}},
        {"content": b'{ "item": "book", "quantity": 2 }', "json": None},
    ],
    ids=["body", "query", "same-json-other-bytes"],
)
async def test_same_key_with_a_different_request_is_422_and_nothing_runs(
    store: AsyncStore, calls: Calls, change: dict[str, Any]
) -> None:
    async with client_for(build_app(store, calls)) as client:
        first = await post_order(client)
        kwargs = {"json": ORDER} | change
        reused = await client.post("/orders", headers=key(), **kwargs)
        replay = await post_order(client)
    assert reused.status_code == 422
    assert problem_type(reused) == "idempotency-key-reused"
    assert calls["orders"] == 1
    assert replay.content == first.content


async def test_different_request_is_422_even_while_the_first_runs(
    store: AsyncStore, calls: Calls
) -> None:
    gate = Gate()
    async with client_for(build_app(store, calls, gate)) as client:
        first = asyncio.create_task(client.post("/slow", headers=key()))
        await gate.entered.wait()
        reused = await client.post("/slow", headers=key(), content=b"other")
        gate.opened.set()
        await first
    assert reused.status_code == 422
    assert calls["slow"] == 1


async def test_same_key_on_another_method_or_path_is_another_record(
    store: AsyncStore, calls: Calls
) -> None:
    # The record id hashes (scope, method, route, key): a key is unique per route and method.
    async with client_for(build_app(store, calls)) as client:
        await post_order(client)
        patched = await client.patch("/orders", headers=key(), json=ORDER)
        other = await client.post("/status/201", headers=key(), json=ORDER)
    assert patched.status_code == 201 and REPLAYED not in patched.headers
    assert other.status_code == 201 and REPLAYED not in other.headers
    assert calls["orders"] == 2
    assert calls["status"] == 1


async def test_missing_key_is_400_when_required_app_wide(store: AsyncStore, calls: Calls) -> None:
    async with client_for(build_app(store, calls, required=True)) as client:
        response = await client.post("/orders", json=ORDER)
        with_key = await post_order(client)
    assert response.status_code == 400
    assert problem_type(response) == "idempotency-key-missing"
    assert with_key.status_code == 201
    assert calls["orders"] == 1


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


@pytest.mark.parametrize(
    "headers",
    [
        [("Idempotency-Key", "")],
        [("Idempotency-Key", '""')],
        [("Idempotency-Key", "k" * 256)],
        [("Idempotency-Key", '"unterminated')],
        [("Idempotency-Key", '"a" trailing')],
        [("Idempotency-Key", "a\x01b")],
        [("Idempotency-Key", b"caf\xc3\xa9")],
        [("Idempotency-Key", "one"), ("Idempotency-Key", "two")],
        [("Idempotency-Key", "same"), ("Idempotency-Key", "same")],
    ],
    ids=[
        "empty",
        "empty-quoted",
        "256-chars",
        "unterminated",
        "trailing",
        "control",
        "non-ascii",
        "two-fields",
        "two-equal-fields",
    ],
)
async def test_malformed_key_is_400_and_nothing_runs(
    store: AsyncStore, calls: Calls, headers: list[tuple[str, str | bytes]]
) -> None:
    async with client_for(build_app(store, calls)) as client:
        raw = [(n.encode(), v if isinstance(v, bytes) else v.encode()) for n, v in headers]
        response = await client.post("/orders", json=ORDER, headers=raw)
    assert response.status_code == 400
    assert problem_type(response) == "idempotency-key-invalid"
    assert calls["orders"] == 0


async def test_key_of_255_characters_is_accepted(store: AsyncStore, calls: Calls) -> None:
    async with client_for(build_app(store, calls)) as client:
        first = await client.post("/orders", json=ORDER, headers={"Idempotency-Key": "k" * 255})
        replay = await client.post("/orders", json=ORDER, headers={"Idempotency-Key": "k" * 255})
    assert first.status_code == 201
    assert replay.headers[REPLAYED] == "true"


async def test_body_over_the_limit_with_content_length_is_413_and_nothing_runs(
    store: AsyncStore, calls: Calls
) -> None:
    async with client_for(build_app(store, calls, max_body_size=100)) as client:
        too_big = await post_order(client, content=b"x" * 101)
        exact = await post_order(client, content=b"x" * 100)
    assert too_big.status_code == 413
    assert problem_type(too_big) == "idempotency-request-too-large"
    # Nothing was reserved: the same key then runs with a body within the limit (no 422).
    assert exact.status_code == 201
    assert calls["orders"] == 1


async def test_chunked_body_over_the_limit_is_413_and_nothing_runs(
    store: AsyncStore, calls: Calls
) -> None:
    async def chunks(total: int) -> AsyncIterator[bytes]:
        for _ in range(total // 10):
            yield b"y" * 10

    async with client_for(build_app(store, calls, max_body_size=100)) as client:
        too_big = await post_order(client, content=chunks(110))
        exact = await post_order(client, "k2", content=chunks(100))
        replay = await post_order(client, "k2", content=chunks(100))
    assert "content-length" not in too_big.request.headers
    assert too_big.status_code == 413
    assert exact.status_code == 201
    assert exact.json()["sha"] == hashlib.sha256(b"y" * 100).hexdigest()
    assert replay.headers[REPLAYED] == "true"
    assert calls["orders"] == 1


class BrokenStore(AsyncMemoryStore):
    """A store whose reserve fails as an unreachable store does (test double of a store outage)."""

    async def reserve(self, record_id: str, fingerprint: str, *, lease: float, ttl: float) -> Any:
        raise StoreUnavailableError("connection refused", store="broken")


class CompleteFailsStore(AsyncMemoryStore):
    """Reserves fine, then cannot store the response."""

    async def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        raise StoreUnavailableError("connection reset", store="broken")


async def test_store_outage_is_503_with_retry_after_and_nothing_runs(calls: Calls) -> None:
    async with client_for(build_app(BrokenStore(), calls, store_retry_after=7)) as client:
        response = await post_order(client)
    assert response.status_code == 503
    assert problem_type(response) == "idempotency-store-unavailable"
    assert response.headers["retry-after"] == "7"
    assert calls["orders"] == 0


async def test_store_outage_with_fail_open_runs_the_handler_with_its_body(
    calls: Calls, caplog: pytest.LogCaptureFixture
) -> None:
    app = build_app(BrokenStore(), calls, on_store_error="fail_open")
    async with client_for(app) as client:
        first = await post_order(client)
        second = await post_order(client)
    assert (first.status_code, second.status_code) == (201, 201)
    assert first.json()["sha"] == hashlib.sha256(first.request.content).hexdigest()
    assert REPLAYED not in second.headers
    assert calls["orders"] == 2
    assert "running unprotected" in caplog.text


async def test_store_failing_on_complete_still_delivers_the_response(calls: Calls) -> None:
    async with client_for(build_app(CompleteFailsStore(), calls)) as client:
        response = await post_order(client)
    assert response.status_code == 201
    assert response.json()["call"] == 1


async def test_optional_route_without_key_runs_unprotected_every_time(
    store: AsyncStore, calls: Calls
) -> None:
    async with client_for(build_app(store, calls)) as client:
        first = await client.post("/orders", json=ORDER)
        second = await client.post("/orders", json=ORDER)
    assert (first.json()["call"], second.json()["call"]) == (1, 2)
    assert REPLAYED not in second.headers


# -- what is stored and replayed ------------------------------------------------------------


async def test_set_cookie_and_deny_listed_headers_are_not_replayed(
    store: AsyncStore, calls: Calls
) -> None:
    async with client_for(build_app(store, calls)) as client:
        first = await post_order(client)
        replay = await post_order(client)
    assert first.headers["set-cookie"] == "session=1"
    assert "set-cookie" not in replay.headers
    assert replay.headers["x-custom"] == "c1"


async def test_custom_denylist_drops_more_headers(store: AsyncStore, calls: Calls) -> None:
    app = build_app(store, calls, replay_header_denylist=frozenset({"X-Custom", "set-cookie"}))
    async with client_for(app) as client:
        await post_order(client)
        replay = await post_order(client)
    assert "x-custom" not in replay.headers
    assert replay.headers["etag"] == '"v1"'


async def test_allowlist_keeps_only_the_listed_headers(store: AsyncStore, calls: Calls) -> None:
    app = build_app(
        store, calls, replay_header_allowlist=frozenset({"Location", "Content-Type", "Set-Cookie"})
    )
    async with client_for(app) as client:
        first = await post_order(client)
        replay = await post_order(client)
    assert replay.headers["location"] == "/orders/1"
    assert replay.headers["content-type"] == "application/json"
    assert "etag" not in replay.headers
    assert "x-custom" not in replay.headers
    # The deny-list still wins over the allow-list.
    assert "set-cookie" not in replay.headers
    assert replay.content == first.content


async def test_handler_exception_releases_the_key_and_the_retry_runs(
    store: AsyncStore, calls: Calls
) -> None:
    async with client_for(build_app(store, calls)) as client:
        failed = await client.post("/flaky", headers=key())
        retried = await client.post("/flaky", headers=key())
        replay = await client.post("/flaky", headers=key())
    assert failed.status_code == 500
    assert retried.status_code == 201 and retried.json()["call"] == 2
    assert replay.headers[REPLAYED] == "true" and replay.json()["call"] == 2
    assert calls["flaky"] == 2


@pytest.mark.parametrize("status", [500, 502, 503, 400, 401, 403, 408, 409, 413, 422, 429])
async def test_5xx_and_request_level_rejections_release_the_key(
    store: AsyncStore, calls: Calls, status: int
) -> None:
    async with client_for(build_app(store, calls)) as client:
        first = await client.post(f"/status/{status}", headers=key())
        second = await client.post(f"/status/{status}", headers=key())
    assert first.status_code == second.status_code == status
    assert REPLAYED not in second.headers
    assert calls["status"] == 2


@pytest.mark.parametrize("status", [200, 201, 202, 204, 303, 404, 410])
async def test_2xx_3xx_and_other_4xx_are_stored_and_replayed(
    store: AsyncStore, calls: Calls, status: int
) -> None:
    async with client_for(build_app(store, calls)) as client:
        first = await client.post(f"/status/{status}", headers=key())
        second = await client.post(f"/status/{status}", headers=key())
    assert second.status_code == first.status_code == status
    assert second.headers[REPLAYED] == "true"
    assert second.content == first.content
    assert calls["status"] == 1


async def test_store_server_errors_keeps_5xx(store: AsyncStore, calls: Calls) -> None:
    async with client_for(build_app(store, calls, store_server_errors=True)) as client:
        await client.post("/status/503", headers=key())
        second = await client.post("/status/503", headers=key())
    assert second.status_code == 503
    assert second.headers[REPLAYED] == "true"
    assert calls["status"] == 1


async def test_release_statuses_setting_replaces_the_default(
    store: AsyncStore, calls: Calls
) -> None:
    app = build_app(store, calls, release_statuses=frozenset({404}))
    async with client_for(app) as client:
        await client.post("/status/404", headers=key("a"))
        not_found = await client.post("/status/404", headers=key("a"))
        await client.post("/status/409", headers=key("b"))
        conflict = await client.post("/status/409", headers=key("b"))
    assert REPLAYED not in not_found.headers
    assert conflict.headers[REPLAYED] == "true"
    assert calls["status"] == 3


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


async def test_response_over_the_storable_size_passes_through_and_replays_without_body(
    store: AsyncStore, calls: Calls
) -> None:
    async with client_for(build_app(store, calls, max_stored_body_size=1000)) as client:
        first = await client.post("/big", headers=key())
        replay = await client.post("/big", headers=key())
    assert first.status_code == 201
    assert first.content == b"x" * 5000
    assert REPLAYED not in first.headers
    assert replay.status_code == 201
    assert replay.headers["location"] == "/big/1"
    assert replay.headers["idempotency-body-omitted"] == "true"
    assert replay.headers[REPLAYED] == "true"
    assert replay.headers["content-length"] == "0"
    assert replay.content == b""
    assert calls["big"] == 1


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


async def test_keys_are_scoped_by_authorization_header(store: AsyncStore, calls: Calls) -> None:
    alice = {**key(), "Authorization": "Bearer alice"}
    bob = {**key(), "Authorization": "Bearer bob"}
    async with client_for(build_app(store, calls)) as client:
        a1 = await client.post("/orders", json=ORDER, headers=alice)
        b1 = await client.post("/orders", json=ORDER, headers=bob)
        a2 = await client.post("/orders", json=ORDER, headers=alice)
        b2 = await client.post("/orders", json=ORDER, headers=bob)
    assert calls["orders"] == 2
    assert a2.content == a1.content and b2.content == b1.content
    assert a1.content != b1.content
    assert a2.headers[REPLAYED] == b2.headers[REPLAYED] == "true"


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


async def test_custom_scope_resolver_decides_the_scope(store: AsyncStore, calls: Calls) -> None:
    def tenant(request: retrysafe.Request) -> str:
        return request.header("X-Tenant") or ""

    app = build_app(store, calls, scope_resolver=tenant)
    async with client_for(app) as client:
        t1 = await client.post("/orders", json=ORDER, headers={**key(), "X-Tenant": "t1"})
        t1_other_auth = await client.post(
            "/orders", json=ORDER, headers={**key(), "X-Tenant": "t1", "Authorization": "B x"}
        )
        t2 = await client.post("/orders", json=ORDER, headers={**key(), "X-Tenant": "t2"})
    assert t1_other_auth.headers[REPLAYED] == "true"
    assert t1_other_auth.content == t1.content
    assert REPLAYED not in t2.headers
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


async def test_get_and_unprotected_methods_pass_straight_through(
    store: AsyncStore, calls: Calls
) -> None:
    async with client_for(build_app(store, calls, required=True)) as client:
        g1 = await client.get("/orders", headers=key())
        g2 = await client.get("/orders", headers=key())
        p1 = await client.put("/orders", json=ORDER, headers={"Idempotency-Key": ""})
        p2 = await client.put("/orders", json=ORDER)
    assert (g1.json()["call"], g2.json()["call"]) == (1, 2)
    assert (p1.status_code, p2.status_code) == (201, 201)
    assert calls["orders"] == 2


async def test_configured_methods_protect_put(store: AsyncStore, calls: Calls) -> None:
    app = build_app(store, calls, methods=frozenset({"PUT"}))
    async with client_for(app) as client:
        await client.put("/orders", json=ORDER, headers=key())
        replay = await client.put("/orders", json=ORDER, headers=key())
        p1 = await post_order(client)
        p2 = await post_order(client)
    assert replay.headers[REPLAYED] == "true"
    assert REPLAYED not in p2.headers and p1.json()["call"] != p2.json()["call"]


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


async def test_lease_renewal_keeps_a_slow_handler_from_running_twice(calls: Calls) -> None:
    app = build_app(AsyncMemoryStore(), calls, lease=0.3)
    async with client_for(app) as client:
        first = asyncio.create_task(client.post("/sleepy", params={"s": "1.0"}, headers=key()))
        answers = []
        for _ in range(4):
            await asyncio.sleep(0.2)
            answers.append(await client.post("/sleepy", params={"s": "1.0"}, headers=key()))
        done = await first
        replay = await client.post("/sleepy", params={"s": "1.0"}, headers=key())
    assert [a.status_code for a in answers] == [409] * 4
    assert done.status_code == 201
    assert replay.headers[REPLAYED] == "true"
    assert calls["sleepy"] == 1


async def test_takeover_after_a_lapsed_lease_fences_the_old_request(
    calls: Calls, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    gate = Gate()
    store = AsyncMemoryStore(clock=clock)

    async def slow_then_fast(scope: Any, receive: Any, send: Any) -> None:
        n = calls.hit("op")
        if n == 1:
            gate.entered.set()
            await gate.opened.wait()
        response = JSONResponse({"call": n}, status_code=201)
        await response(scope, receive, send)

    app = IdempotencyMiddleware(slow_then_fast, store=store, lease=5.0)
    async with client_for(app) as client:
        old = asyncio.create_task(client.post("/op", headers=key()))
        await gate.entered.wait()
        clock.now += 6.0  # the old request's process looks dead: its lease lapsed
        new = await client.post("/op", headers=key())
        gate.opened.set()
        old_response = await old
        replay = await client.post("/op", headers=key())
    assert new.json() == {"call": 2}
    assert old_response.json() == {"call": 1}  # its own client still gets its answer
    assert replay.json() == {"call": 2}  # but it did not overwrite the record
    assert replay.headers[REPLAYED] == "true"
    assert calls["op"] == 2
    assert "taken over before its response was stored" in caplog.text


async def test_response_is_stored_when_the_client_disconnected_during_send(
    store: AsyncStore, calls: Calls
) -> None:
    app = build_app(store, calls)
    body = json.dumps(ORDER).encode()
    headers = [(b"idempotency-key", b'"key-1"'), (b"content-type", b"application/json")]
    sent = await drive(app, http_scope("POST", "/orders", headers), body_then(body), fail_send=True)
    assert sent[0]["type"] == "http.response.start"  # the send that raised
    async with client_for(app) as client:
        retry = await client.post("/orders", content=body, headers=dict(key()))
    assert retry.status_code == 201
    assert retry.headers[REPLAYED] == "true"
    assert retry.json()["call"] == 1
    assert calls["orders"] == 1


async def test_streaming_response_is_stored_when_the_server_reports_a_disconnect(
    store: AsyncStore, calls: Calls
) -> None:
    # uvicorn (ASGI spec 2.3) answers receive() with http.disconnect once the client is gone;
    # Starlette's StreamingResponse then stops streaming unless the middleware shields it.
    app = build_app(store, calls)
    scope = http_scope("POST", "/stream", [(b"idempotency-key", b'"key-1"')])
    await drive(app, scope, body_then(b"", after="disconnect"))
    async with client_for(app) as client:
        retry = await client.post("/stream", headers=key())
    assert retry.status_code == 201
    assert retry.headers[REPLAYED] == "true"
    assert retry.content == b"".join(f"chunk-1-{i};".encode() for i in range(5))
    assert calls["stream"] == 1


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
