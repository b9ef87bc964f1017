"""Transactional mode through the gRPC interceptors, on SQLite and PostgreSQL: the handler's
writes on the idempotent transaction commit together with the stored outcome (one call sent
twice: one row, a replay), and a handler that fails after writing leaves no row and frees the
key. Sync and aio servers."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ..stores.backend_postgres import admin_connect, fresh_table_url, run_schema
from .harness import Server, call

KINDS = [pytest.param("sync", id="sync"), pytest.param("aio", id="aio")]
DATABASES = [pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres")]


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


@pytest.fixture(params=DATABASES)
def database(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, str, Callable[[], list[str]]]]:
    """(store URL, orders table, the table's items) on one SQL database."""
    if request.param == "sqlite":
        path = tmp_path / "shop.db"
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE orders (item TEXT)")

        def sqlite_items() -> list[str]:
            with sqlite3.connect(path) as conn:
                return [row[0] for row in conn.execute("SELECT item FROM orders")]

        yield f"sqlite:///{path}", "orders", sqlite_items
        return
    url, schema = run_schema(request)
    store_url = fresh_table_url(request)
    orders = f'"{schema}".grpc_orders_{abs(hash(store_url)) % 10**8}'
    with admin_connect(url) as conn:
        conn.execute(f"CREATE TABLE {orders} (item text NOT NULL)")

    def postgres_items() -> list[str]:
        with admin_connect(url) as conn:
            return [row[0] for row in conn.execute(f"SELECT item FROM {orders}")]

    yield store_url, orders, postgres_items
    with admin_connect(url) as conn:
        conn.execute(f"DROP TABLE {orders}")


@pytest.fixture
def server(kind: str, database: tuple[str, str, Any], tmp_path: Path) -> Iterator[Server]:
    made = Server(kind, database[0], tmp_path / "effects.db", transactional=True, lease=5)
    yield made
    made.close()


def test_the_write_and_the_outcome_commit_together(
    server: Server, database: tuple[str, str, Callable[[], list[str]]]
) -> None:
    _, table, items = database
    request = {"item": "book", "tx": table}
    first = call(server.channel, request, key="t1")
    again = call(server.channel, request, key="t1")
    assert first.code is again.code is grpc.StatusCode.OK
    assert again.replayed and again.body == first.body
    assert items() == ["book"]


def test_a_failure_after_the_write_rolls_it_back_and_frees_the_key(
    server: Server, database: tuple[str, str, Callable[[], list[str]]]
) -> None:
    _, table, items = database
    failing = {"item": "lamp", "tx": table, "fail_after_write": True}
    assert call(server.channel, failing, key="t2").code is grpc.StatusCode.UNKNOWN
    assert items() == []
    retried = call(server.channel, failing, key="t2")
    assert retried.code is grpc.StatusCode.UNKNOWN and not retried.replayed  # it ran again
    assert items() == []
