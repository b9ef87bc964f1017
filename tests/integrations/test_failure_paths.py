"""Failure paths found in review: ambiguous store answers, busy locks, small pools, failing
ORM flushes and concurrent transaction requests never lead to a second run or a 500."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Integer, String
from sqlalchemy.orm import declarative_base
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

import retrysafe
from retrysafe import StoreUnavailableError
from retrysafe.asgi import IdempotencyMiddleware
from retrysafe.contrib.sqlalchemy import session
from retrysafe.stores import AsyncMemoryStore, AsyncSQLiteStore
from retrysafe.stores.postgres import AsyncPostgresStore

from ..stores.backend_postgres import fresh_table_url
from .helpers import REPLAYED, client_for, key, problem_type


def _app(handler: Any, store: Any, **options: Any) -> Any:
    routes = [Route("/op", handler, methods=["POST"])]
    return IdempotencyMiddleware(Starlette(routes=routes), store=store, **options)


async def test_failed_mark_still_forbids_a_rerun() -> None:
    store = AsyncMemoryStore()
    original = store.mark_committed
    failing = {"on": True}
    runs = {"n": 0}

    async def flaky(*args: Any, **kwargs: Any) -> bool:
        if failing["on"]:
            raise StoreUnavailableError("blip", store="memory")
        return await original(*args, **kwargs)

    store.mark_committed = flaky  # type: ignore[method-assign]

    async def pay(request: Request) -> Response:
        runs["n"] += 1  # the external effect happened
        assert not await retrysafe.mark_committed(request)
        return Response(status_code=502)

    async with client_for(_app(pay, store)) as client:
        first = await client.post("/op", headers=key("m1"))
        failing["on"] = False
        retry = await client.post("/op", headers=key("m1"))
    assert first.status_code == 502
    assert retry.status_code == 409  # never a second run of the effect
    assert runs["n"] == 1


async def test_mark_without_the_transaction_in_transactional_mode_is_honoured(
    tmp_path: Path,
) -> None:
    runs = {"n": 0}

    async def pay(request: Request) -> Response:
        runs["n"] += 1  # an external effect, no database write
        assert await retrysafe.mark_committed(request)
        return Response(status_code=502)

    app = _app(pay, AsyncSQLiteStore(tmp_path / "s.db"), transactional=True)
    async with client_for(app) as client:
        await client.post("/op", headers=key("m2"))
        retry = await client.post("/op", headers=key("m2"))
    assert problem_type(retry) == "idempotency-outcome-unknown"
    assert runs["n"] == 1


async def test_failed_completion_keeps_the_key_renewed_until_it_is_stored() -> None:
    store = AsyncMemoryStore()
    original = store.complete
    down = {"on": True}
    runs = {"n": 0}

    async def flaky(*args: Any, **kwargs: Any) -> bool:
        if down["on"]:
            raise StoreUnavailableError("complete blip", store="memory")
        return await original(*args, **kwargs)

    store.complete = flaky  # type: ignore[method-assign]

    async def create(request: Request) -> Response:
        runs["n"] += 1
        return PlainTextResponse("created", 201)

    async with client_for(_app(create, store, lease=0.3)) as client:
        first = await client.post("/op", headers=key("c1"))
        await asyncio.sleep(0.7)  # over two leases: only renewals keep the key
        during = await client.post("/op", headers=key("c1"))
        down["on"] = False
        for _ in range(50):
            replay = await client.post("/op", headers=key("c1"))
            if replay.status_code == 201:
                break
            await asyncio.sleep(0.05)
    assert first.status_code == 201
    assert during.status_code == 409
    assert replay.headers[REPLAYED] == "true" and replay.text == "created"
    assert runs["n"] == 1


async def test_busy_sqlite_write_lock_is_a_503_not_a_500(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = AsyncSQLiteStore(path, busy_timeout=0.2)

    async def create(request: Request) -> Response:
        await retrysafe.transaction(request)
        return Response(status_code=201)

    app = _app(create, store, transactional=True)
    async with client_for(app) as client:
        await client.post("/op", headers=key("warm"))  # creates the file and table
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            busy = await client.post("/op", headers=key("b1"))
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        retry = await client.post("/op", headers=key("b1"))
    assert busy.status_code == 503 and int(busy.headers["retry-after"]) >= 1
    assert problem_type(busy) == "idempotency-store-unavailable"
    assert retry.status_code == 201  # nothing ran, the key was not left wedged


async def test_transaction_connections_are_not_tracked_after_closing(tmp_path: Path) -> None:
    store = AsyncSQLiteStore(tmp_path / "s.db")

    async def create(request: Request) -> Response:
        conn = await retrysafe.transaction(request)
        await asyncio.sleep(0.01)  # many open at once: more than the idle list keeps
        conn.execute("SELECT 1")
        return Response(status_code=201)

    app = _app(create, store, transactional=True)
    async with client_for(app) as client:
        for round_ in range(3):
            replies = await asyncio.gather(
                *(client.post("/op", headers=key(f"r{round_}-{i}")) for i in range(20))
            )
            assert {r.status_code for r in replies} <= {201, 503}
    tracked = store.sync._connections
    assert len(tracked) <= 10  # idle transaction connections plus the store's own


Base: Any = declarative_base()


class Item(Base):  # type: ignore[misc]
    __tablename__ = "items"
    id = Column(Integer, primary_key=True)
    name = Column(String, unique=True)


async def test_failing_orm_flush_frees_the_key(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT UNIQUE)")
        conn.execute("INSERT INTO items (name) VALUES ('taken')")
    names = {"next": "taken"}

    async def create(request: Request) -> Response:
        db = await session(request)
        db.add(Item(name=names["next"]))  # flushed by the library: the unique name fails
        return PlainTextResponse("created", 201)

    async with client_for(_app(create, AsyncSQLiteStore(path), transactional=True)) as client:
        failed = await client.post("/op", headers=key("f1"))
        names["next"] = "free"
        retry = await client.post("/op", headers=key("f1"))
    assert failed.status_code == 500
    assert retry.status_code == 201  # the key was released, not left in progress


@pytest.fixture
async def small_pool(request: pytest.FixtureRequest) -> AsyncIterator[AsyncPostgresStore]:
    store = AsyncPostgresStore(fresh_table_url(request, max_size="2", pool_timeout="1"))
    yield store
    await store.aclose()


async def test_released_transactions_do_not_starve_a_small_pool(
    small_pool: AsyncPostgresStore,
) -> None:
    runs = {"n": 0}

    async def create(request: Request) -> Response:
        runs["n"] += 1
        conn = await retrysafe.transaction(request)
        await conn.execute("SELECT 1")
        await asyncio.sleep(0.1)
        return Response(status_code=422)  # a released status: the retry may run

    app = _app(create, small_pool, transactional=True)
    async with client_for(app) as client:
        first = await asyncio.gather(*(client.post("/op", headers=key(f"p{i}")) for i in (1, 2)))
        again = await asyncio.gather(*(client.post("/op", headers=key(f"p{i}")) for i in (1, 2)))
    assert [r.status_code for r in first] == [422, 422]
    assert [r.status_code for r in again] == [422, 422]
    assert runs["n"] == 4


async def test_concurrent_transaction_calls_share_one_connection(
    small_pool: AsyncPostgresStore,
) -> None:
    seen: list[Any] = []

    async def create(request: Request) -> Response:
        conns = await asyncio.gather(retrysafe.transaction(request), retrysafe.transaction(request))
        seen.append(conns[0] is conns[1])
        return Response(status_code=201)

    app = _app(create, small_pool, transactional=True)
    async with client_for(app) as client:
        replies = [await client.post("/op", headers=key(f"s{i}")) for i in range(4)]
    assert [r.status_code for r in replies] == [201] * 4  # no leaked pool connections
    assert seen == [True] * 4


async def test_lost_transaction_connection_is_a_503_and_the_retry_runs(
    small_pool: AsyncPostgresStore, request: pytest.FixtureRequest
) -> None:
    from ..stores.backend_postgres import admin_connect

    url: str = request.getfixturevalue("postgres_url")
    runs = {"n": 0}

    async def create(request: Request) -> Response:
        runs["n"] += 1
        conn = await retrysafe.transaction(request)
        if runs["n"] == 1:
            with admin_connect(url) as admin:  # the backend dies under the running request
                admin.execute("SELECT pg_terminate_backend(%s)", (conn.get_server_pid(),))
        await conn.execute("SELECT 1")
        return Response(status_code=201)

    app = _app(create, small_pool, transactional=True)
    async with client_for(app) as client:
        lost = await client.post("/op", headers=key("lost-1"))
        retry = await client.post("/op", headers=key("lost-1"))
    assert lost.status_code == 503
    assert problem_type(lost) == "idempotency-store-unavailable"
    assert retry.status_code == 201 and runs["n"] == 2
