"""Transactional mode with SQLite, mark_committed and the outcome-unknown state, in-process."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import retrysafe
from retrysafe.asgi import IdempotencyMiddleware
from retrysafe.stores import AsyncMemoryStore, AsyncSQLiteStore

from ..clock import FakeClock
from .helpers import REPLAYED, client_for, key, problem_type


def _rows(path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT id, item FROM orders ORDER BY id").fetchall()


def _sqlite_app(path: Path, store: AsyncSQLiteStore, **options: Any) -> tuple[Any, dict[str, Any]]:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT)")
    control: dict[str, Any] = {"calls": 0, "fail": None, "status": 201, "gate": None}

    async def create(request: Request) -> Response:
        control["calls"] += 1
        item = (await request.json())["item"]
        conn = await retrysafe.transaction(request)
        row = conn.execute("INSERT INTO orders (item) VALUES (?) RETURNING id", (item,)).fetchone()
        if control["gate"] is not None:
            await control["gate"].wait()
        if control["fail"]:
            raise RuntimeError(control["fail"])
        return JSONResponse({"id": row[0]}, control["status"], headers={"Location": f"/o/{row[0]}"})

    app = Starlette(routes=[Route("/orders", create, methods=["POST"])])
    return IdempotencyMiddleware(app, store=store, transactional=True, **options), control


async def test_handler_writes_and_record_commit_together(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    app, control = _sqlite_app(db, AsyncSQLiteStore(db))
    async with client_for(app) as client:
        first = await client.post("/orders", json={"item": "tea"}, headers=key("t1"))
        again = await client.post("/orders", json={"item": "tea"}, headers=key("t1"))
    assert first.status_code == 201 and again.status_code == 201
    assert again.headers[REPLAYED] == "true" and again.content == first.content
    assert control["calls"] == 1
    assert _rows(db) == [(first.json()["id"], "tea")]


async def test_handler_error_rolls_back_its_writes_and_frees_the_key(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    app, control = _sqlite_app(db, AsyncSQLiteStore(db))
    control["fail"] = "boom after the insert"
    async with client_for(app) as client:
        failed = await client.post("/orders", json={"item": "tea"}, headers=key("t2"))
        assert failed.status_code == 500
        assert _rows(db) == []  # the insert did not survive the failure
        control["fail"] = None
        retried = await client.post("/orders", json={"item": "tea"}, headers=key("t2"))
    assert retried.status_code == 201 and REPLAYED not in retried.headers
    assert len(_rows(db)) == 1 and control["calls"] == 2


async def test_released_status_rolls_back(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    app, control = _sqlite_app(db, AsyncSQLiteStore(db))
    control["status"] = 409  # a request-level rejection: not stored, so not kept either
    async with client_for(app) as client:
        rejected = await client.post("/orders", json={"item": "tea"}, headers=key("t3"))
    assert rejected.status_code == 409
    assert _rows(db) == []


async def test_takeover_before_the_transaction_begins_fences_the_old_request(
    tmp_path: Path,
) -> None:
    db = tmp_path / "app.db"
    clock = FakeClock()
    store = AsyncSQLiteStore(db, clock=clock)
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT)")
    gate = asyncio.Event()
    calls = {"n": 0}
    started = asyncio.Event()

    async def create(request: Request) -> Response:
        calls["n"] += 1
        started.set()
        if calls["n"] == 1:
            await gate.wait()  # slow before writing: its lease lapses meanwhile
        conn = await retrysafe.transaction(request)
        row = conn.execute("INSERT INTO orders (item) VALUES ('x') RETURNING id").fetchone()
        return JSONResponse({"id": row[0]}, 201)

    app = IdempotencyMiddleware(
        Starlette(routes=[Route("/orders", create, methods=["POST"])]),
        store=store,
        transactional=True,
        lease=5.0,
    )
    async with client_for(app) as client:
        old = asyncio.create_task(client.post("/orders", json={}, headers=key("t5")))
        await started.wait()
        clock.now += 10  # the old request's lease lapsed (it stopped renewing)
        new = await client.post("/orders", json={}, headers=key("t5"))
        gate.set()
        old_response = await old
        replay = await client.post("/orders", json={}, headers=key("t5"))
    assert new.status_code == 201
    assert old_response.status_code == 409
    assert problem_type(old_response) == "idempotency-request-in-progress"
    assert len(_rows(db)) == 1  # the old request's insert was rolled back
    assert replay.headers[REPLAYED] == "true" and replay.content == new.content


async def test_transactional_mode_needs_a_sql_store() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:  # pragma: no cover
        pass

    with pytest.raises(retrysafe.ConfigurationError, match="SQL store"):
        IdempotencyMiddleware(app, store=AsyncMemoryStore(), transactional=True)


async def test_transaction_outside_transactional_mode_is_a_clear_error() -> None:
    seen: dict[str, Any] = {}

    async def create(request: Request) -> Response:
        seen["optional"] = await retrysafe.transaction(request, optional=True)
        with pytest.raises(retrysafe.ConfigurationError, match="transactional mode"):
            await retrysafe.transaction(request)
        return Response(status_code=201)

    app = IdempotencyMiddleware(
        Starlette(routes=[Route("/orders", create, methods=["POST"])]), store=AsyncMemoryStore()
    )
    async with client_for(app) as client:
        response = await client.post("/orders", headers=key("t6"))
    assert response.status_code == 201
    assert seen["optional"] is None


async def test_committed_effects_are_never_run_again_after_a_crash() -> None:
    clock = FakeClock()
    store = AsyncMemoryStore(clock=clock)
    events: list[str] = []
    calls = {"n": 0}
    started = asyncio.Event()

    async def create(request: Request) -> Response:
        calls["n"] += 1
        started.set()
        assert await retrysafe.mark_committed(request)
        # The process "dies" here: the handler fails after its effects, no response stored.
        raise RuntimeError("crash after the effect")

    app = IdempotencyMiddleware(
        Starlette(routes=[Route("/pay", create, methods=["POST"])]),
        store=store,
        lease=5.0,
        on_event=lambda event, details: events.append(event),
    )
    async with client_for(app) as client:
        crashed = await client.post("/pay", headers=key("c1"))
        assert crashed.status_code == 500
        # Effects committed, then a failure: no answer to replay and not safe to rerun.
        after = await client.post("/pay", headers=key("c1"))
        assert after.status_code == 409
        assert problem_type(after) == "idempotency-outcome-unknown"
        assert calls["n"] == 1
        assert "outcome_unknown" in events
        # An operator checked the effects and frees the key: the next request runs.
        records = list(store.sync._entries)
        assert len(records) == 1
        assert await store.delete(records[0])
        resolved = await client.post("/pay", headers=key("c1"))
    assert resolved.status_code == 500 and calls["n"] == 2


async def test_committed_request_that_dies_silently_is_unknown_after_its_lease() -> None:
    clock = FakeClock()
    store = AsyncMemoryStore(clock=clock)
    gate = asyncio.Event()
    calls = {"n": 0}
    started = asyncio.Event()

    async def create(request: Request) -> Response:
        calls["n"] += 1
        started.set()
        await retrysafe.mark_committed(request)
        await gate.wait()  # hangs, as a frozen process would, never renewing (clock is fake)
        return Response(status_code=201)

    app = IdempotencyMiddleware(
        Starlette(routes=[Route("/pay", create, methods=["POST"])]), store=store, lease=5.0
    )
    async with client_for(app) as client:
        hung = asyncio.create_task(client.post("/pay", headers=key("c3")))
        await started.wait()
        during = await client.post("/pay", headers=key("c3"))
        assert problem_type(during) == "idempotency-request-in-progress"
        clock.now += 6  # the lease lapses: an uncommitted reservation would be taken over now
        after = await client.post("/pay", headers=key("c3"))
        assert after.status_code == 409
        assert problem_type(after) == "idempotency-outcome-unknown"
        # The frozen request wakes up: it still holds the token, so its answer is stored.
        gate.set()
        assert (await hung).status_code == 201
        replay = await client.post("/pay", headers=key("c3"))
    assert replay.status_code == 201 and replay.headers[REPLAYED] == "true"
    assert calls["n"] == 1


async def test_uncommitted_crash_is_taken_over_after_the_lease() -> None:
    clock = FakeClock()
    store = AsyncMemoryStore(clock=clock)
    calls = {"n": 0}
    started = asyncio.Event()
    gate = asyncio.Event()

    async def create(request: Request) -> Response:
        calls["n"] += 1
        started.set()
        if calls["n"] == 1:
            await gate.wait()
        return Response(status_code=201)

    app = IdempotencyMiddleware(
        Starlette(routes=[Route("/pay", create, methods=["POST"])]), store=store, lease=5.0
    )
    async with client_for(app) as client:
        hung = asyncio.create_task(client.post("/pay", headers=key("c2")))
        await started.wait()
        clock.now += 6
        taken = await client.post("/pay", headers=key("c2"))
        gate.set()
        await hung
    assert taken.status_code == 201 and calls["n"] == 2
