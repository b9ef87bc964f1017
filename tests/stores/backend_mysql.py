"""The MySQL/MariaDB backend of the conformance suite, and helpers for the other MySQL tests.

Isolation: each test gets a fresh table ``rs_test_<RUN_ID>_<n>`` in the server's test database;
the run drops the tables it created (and nothing else) when it ends.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import pymysql
import pytest

from retrysafe.stores.mysql import AsyncMySQLStore, MySQLStore

from ..conftest import RUN_ID
from .backend_postgres import with_options
from .conftest import Backend, real_sleep

PREFIX = f"rs_test_{RUN_ID}_"
_tables = itertools.count(1)
_cleanup_registered: set[str] = set()


def admin_connect(url: str) -> pymysql.connections.Connection:  # type: ignore[type-arg]
    """A plain autocommit connection for test set-up and inspection."""
    parts = urlsplit(url)
    return pymysql.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=parts.username or "root",
        password=parts.password or "",
        database=parts.path.strip("/"),
        autocommit=True,
    )


def _drop_run_tables(url: str) -> None:
    with admin_connect(url) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = DATABASE() AND table_name LIKE %s",
            (PREFIX.replace("_", "\\_") + "%",),
        )
        for (name,) in cur.fetchall():
            cur.execute(f"DROP TABLE IF EXISTS `{name}`")


def fresh_table_url(request: pytest.FixtureRequest, **options: str) -> str:
    """A store URL naming a new, not yet created table of this run.

    Skips (or fails under CI=true) without a server, through the ``mysql_url`` fixture.
    """
    url: str = request.getfixturevalue("mysql_url")
    if url not in _cleanup_registered:
        _cleanup_registered.add(url)
        request.config.add_cleanup(lambda: _drop_run_tables(url))
    return with_options(url, table=f"{PREFIX}{next(_tables)}", **options)


def fresh_database_url(request: pytest.FixtureRequest) -> str:
    """The URL of a new database of this run (for what has fixed table names: OrderHub, the
    Django ORM store), dropped when the test ends."""
    url: str = request.getfixturevalue("mysql_url")
    name = f"{PREFIX}db_{next(_tables)}"
    with admin_connect(url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{name}`")

    def drop() -> None:
        with admin_connect(url) as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")

    request.addfinalizer(drop)
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


async def mysql_backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    """A fresh table per test; the URL lets other processes open the same table."""
    url = fresh_table_url(request, max_size="10")
    store = AsyncMySQLStore(url)
    sync = MySQLStore(url)
    await store.ensure_schema()
    try:
        yield Backend("mysql", store, sync, real_sleep, url=url, purge_counts=True)
    finally:
        await store.aclose()
        sync.close()
