"""IdempotencyMiddleware wrapping a Litestar app: replay and 409 work."""

from __future__ import annotations

import asyncio
from typing import Any

from litestar import Litestar, post
from litestar.params import JSONBody
from litestar.response import Response

from retrysafe.asgi import IdempotencyMiddleware
from retrysafe.stores import AsyncMemoryStore, AsyncSQLiteStore, AsyncStore

from .helpers import REPLAYED, Calls, client_for, key, problem_type


def build(store: AsyncStore) -> tuple[Any, Calls, asyncio.Event, asyncio.Event]:
    calls = Calls()
    entered, opened = asyncio.Event(), asyncio.Event()

    @post("/orders")
    async def create(data: JSONBody[dict[str, Any]]) -> Response[dict[str, Any]]:
        n = calls.hit("orders")
        return Response({"id": n, **data}, status_code=201, headers={"Location": f"/orders/{n}"})

    @post("/slow")
    async def slow() -> dict[str, Any]:
        n = calls.hit("slow")
        entered.set()
        await opened.wait()
        return {"id": n}

    app = IdempotencyMiddleware(Litestar([create, slow]), store=store)
    return app, calls, entered, opened


async def test_litestar_replays_the_stored_response(tmp_path: Any) -> None:
    for store in (AsyncMemoryStore(), AsyncSQLiteStore(f"{tmp_path}/s.db")):
        app, calls, _, _ = build(store)
        async with client_for(app) as client:
            first = await client.post("/orders", json={"item": "pen"}, headers=key())
            replay = await client.post("/orders", json={"item": "pen"}, headers=key())
            reused = await client.post("/orders", json={"item": "ink"}, headers=key())
        assert first.status_code == 201
        assert replay.status_code == 201
        assert replay.content == first.content
        assert replay.headers["location"] == "/orders/1"
        assert replay.headers[REPLAYED] == "true"
        assert reused.status_code == 422
        assert calls["orders"] == 1
        await store.aclose()


async def test_litestar_answers_409_while_the_first_request_runs() -> None:
    app, calls, entered, opened = build(AsyncMemoryStore())
    async with client_for(app) as client:
        first = asyncio.create_task(client.post("/slow", headers=key()))
        await entered.wait()
        conflict = await client.post("/slow", headers=key())
        opened.set()
        done = await first
        replay = await client.post("/slow", headers=key())
    assert conflict.status_code == 409
    assert problem_type(conflict) == "idempotency-request-in-progress"
    assert int(conflict.headers["retry-after"]) >= 1
    assert done.status_code == 201
    assert replay.headers[REPLAYED] == "true"
    assert replay.content == done.content
    assert calls["slow"] == 1
