"""Transactional mode on a real PostgreSQL: the handler's writes and the completion record
commit together, roll back together, and a fenced-out request leaves nothing behind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import retrysafe
from retrysafe.asgi import IdempotencyMiddleware
from retrysafe.stores.postgres import AsyncPostgresStore

from ..stores.backend_postgres import admin_connect, fresh_table_url, run_schema
from .helpers import REPLAYED, client_for, key, problem_type


@pytest.fixture
async def pg(request: pytest.FixtureRequest) -> AsyncIterator[dict[str, Any]]:
    url, schema = run_schema(request)
    store_url = fresh_table_url(request)
    orders = f'"{schema}".orders_{abs(hash(store_url)) % 10**8}'
    with admin_connect(url) as conn:
        conn.execute(f"CREATE TABLE {orders} (id bigserial PRIMARY KEY, item text NOT NULL)")
    store = AsyncPostgresStore(store_url)
    yield {"url": url, "store": store, "orders": orders, "store_url": store_url}
    await store.aclose()


def _items(env: dict[str, Any]) -> list[str]:
    with admin_connect(env["url"]) as conn:
        return [r[0] for r in conn.execute(f"SELECT item FROM {env['orders']} ORDER BY id")]


def _app(env: dict[str, Any], control: dict[str, Any]) -> Any:
    async def create(request: Request) -> Response:
        control["calls"] += 1
        item = (await request.json())["item"]
        if control.get("before") is not None:
            await control["before"]()
        conn = await retrysafe.transaction(request)
        order_id = await conn.fetchval(
            f"INSERT INTO {env['orders']} (item) VALUES ($1) RETURNING id", item
        )
        if control.get("fail"):
            raise RuntimeError("fails after the insert")
        return JSONResponse({"id": order_id}, 201, headers={"Location": f"/o/{order_id}"})

    app = Starlette(routes=[Route("/orders", create, methods=["POST"])])
    return IdempotencyMiddleware(app, store=env["store"], transactional=True, lease=5.0)


async def test_order_and_record_commit_together(pg: dict[str, Any]) -> None:
    control: dict[str, Any] = {"calls": 0}
    async with client_for(_app(pg, control)) as client:
        first = await client.post("/orders", json={"item": "a"}, headers=key("p1"))
        again = await client.post("/orders", json={"item": "a"}, headers=key("p1"))
    assert first.status_code == 201
    assert again.headers[REPLAYED] == "true" and again.content == first.content
    assert _items(pg) == ["a"] and control["calls"] == 1


async def test_failure_rolls_the_order_back_and_the_retry_runs(pg: dict[str, Any]) -> None:
    control: dict[str, Any] = {"calls": 0, "fail": True}
    async with client_for(_app(pg, control)) as client:
        failed = await client.post("/orders", json={"item": "b"}, headers=key("p2"))
        assert failed.status_code == 500
        assert _items(pg) == []
        control["fail"] = False
        retried = await client.post("/orders", json={"item": "b"}, headers=key("p2"))
    assert retried.status_code == 201 and REPLAYED not in retried.headers
    assert _items(pg) == ["b"]


async def test_fenced_out_request_leaves_no_order(pg: dict[str, Any]) -> None:
    gate = asyncio.Event()
    reached = asyncio.Event()
    calls = {"n": 0}

    async def before() -> None:
        if calls["n"] == 0:
            calls["n"] += 1
            reached.set()
            await gate.wait()

    control: dict[str, Any] = {"calls": 0, "before": before}
    table = pg["store"].options.table
    async with client_for(_app(pg, control)) as client:
        old = asyncio.create_task(client.post("/orders", json={"item": "c"}, headers=key("p3")))
        await reached.wait()
        # The old request's process stalls past its lease (renewals stopped): lapse it.
        with admin_connect(pg["url"]) as conn:
            conn.execute(
                f"UPDATE {table} SET lease_expires_at = clock_timestamp() - interval '1 second'"
            )
        new = await client.post("/orders", json={"item": "c"}, headers=key("p3"))
        gate.set()
        stale = await old
    assert new.status_code == 201
    assert stale.status_code == 409
    assert problem_type(stale) == "idempotency-request-in-progress"
    assert _items(pg) == ["c"]  # one order: the stale request's insert was rolled back
