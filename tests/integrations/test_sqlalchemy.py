"""SQLAlchemy ORM sessions on the idempotent transaction: the ORM's writes commit with the
stored response and vanish with a failure (SQLite and a real PostgreSQL)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from retrysafe.asgi import IdempotencyMiddleware
from retrysafe.contrib.sqlalchemy import async_session, session
from retrysafe.stores import AsyncSQLiteStore
from retrysafe.stores.postgres import AsyncPostgresStore

from ..stores.backend_postgres import admin_connect, fresh_table_url, run_schema
from .helpers import REPLAYED, client_for, key


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "sa_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str] = mapped_column(String(100))


def _sqlite_app(path: Path, control: dict[str, Any]) -> Any:
    async def create(request: Request) -> Response:
        control["calls"] += 1
        db = await session(request)
        order = Order(item=(await request.json())["item"])
        db.add(order)
        db.flush()
        db.commit()  # harmless: retrysafe owns the commit
        if control.get("fail"):
            raise RuntimeError("after the ORM write")
        return JSONResponse({"id": order.id}, 201)

    app = Starlette(routes=[Route("/orders", create, methods=["POST"])])
    return IdempotencyMiddleware(app, store=AsyncSQLiteStore(path), transactional=True)


def _sqlite_items(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [r[0] for r in conn.execute("SELECT item FROM sa_orders ORDER BY id")]


async def test_sqlite_orm_writes_commit_with_the_record(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE sa_orders (id INTEGER PRIMARY KEY, item TEXT)")
    control: dict[str, Any] = {"calls": 0, "fail": True}
    async with client_for(_sqlite_app(path, control)) as client:
        failed = await client.post("/orders", json={"item": "tea"}, headers=key("s1"))
        assert failed.status_code == 500
        assert _sqlite_items(path) == []  # the session's commit() did not commit
        control["fail"] = False
        first = await client.post("/orders", json={"item": "tea"}, headers=key("s1"))
        again = await client.post("/orders", json={"item": "tea"}, headers=key("s1"))
    assert first.status_code == 201 and again.headers[REPLAYED] == "true"
    assert again.content == first.content
    assert _sqlite_items(path) == ["tea"] and control["calls"] == 2


@pytest.fixture
async def pg_store(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, str, Any]]:
    url, schema = run_schema(request)
    with admin_connect(url) as conn:
        conn.execute(
            f'CREATE TABLE IF NOT EXISTS "{schema}".sa_orders (id serial PRIMARY KEY, item text)'
        )
    store = AsyncPostgresStore(fresh_table_url(request))
    yield url, schema, store
    await store.aclose()


async def test_postgres_async_orm_writes_commit_with_the_record(
    pg_store: tuple[str, str, Any],
) -> None:
    url, schema, store = pg_store
    control: dict[str, Any] = {"calls": 0, "fail": True}
    table = Order.__table__.to_metadata(Base.metadata.__class__(), schema=schema)

    async def create(request: Request) -> Response:
        control["calls"] += 1
        db = await async_session(request)
        item = (await request.json())["item"]
        result = await db.execute(table.insert().values(item=item).returning(table.c.id))
        order_id = result.scalar_one()
        await db.commit()  # a savepoint release inside retrysafe's transaction
        seen = (await db.execute(select(table.c.item).where(table.c.id == order_id))).scalar()
        assert seen == item
        if control["fail"]:
            raise RuntimeError("after the ORM write")
        return JSONResponse({"id": order_id}, 201)

    app = IdempotencyMiddleware(
        Starlette(routes=[Route("/orders", create, methods=["POST"])]),
        store=store,
        transactional=True,
    )

    def items() -> list[str]:
        with admin_connect(url) as conn:
            return [r[0] for r in conn.execute(f'SELECT item FROM "{schema}".sa_orders')]

    async with client_for(app) as client:
        failed = await client.post("/orders", json={"item": "pg-tea"}, headers=key("s2"))
        assert failed.status_code == 500
        assert "pg-tea" not in items()
        control["fail"] = False
        first = await client.post("/orders", json={"item": "pg-tea"}, headers=key("s2"))
        again = await client.post("/orders", json={"item": "pg-tea"}, headers=key("s2"))
    assert first.status_code == 201 and again.headers[REPLAYED] == "true"
    assert items().count("pg-tea") == 1
