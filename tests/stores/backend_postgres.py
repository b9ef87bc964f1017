"""The PostgreSQL backend of the conformance suite, and helpers for the other PostgreSQL tests.

Isolation: a test run creates one schema, ``rs_test_<RUN_ID>``, and one fresh table in it per
test; it drops that schema (and nothing else) when the run ends.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import pytest

from retrysafe.stores.postgres import AsyncPostgresStore, PostgresStore

from ..conftest import RUN_ID
from .conftest import Backend, real_sleep

SCHEMA = f"rs_test_{RUN_ID}"
_tables = itertools.count(1)
_schema_ready: set[str] = set()


def with_options(url: str, **options: str) -> str:
    """``url`` with query options added (or replaced)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query.update(options)
    return urlunsplit(parts._replace(query=urlencode(query)))


def admin_connect(url: str) -> psycopg.Connection[tuple[object, ...]]:
    """A plain autocommit connection for test set-up and inspection."""
    return psycopg.connect(url.split("?", 1)[0], autocommit=True)


def run_schema(request: pytest.FixtureRequest) -> tuple[str, str]:
    """Return (server URL, this run's schema), creating the schema once per run.

    Skips (or fails under CI=true) without PostgreSQL, through the ``postgres_url`` fixture.
    """
    url: str = request.getfixturevalue("postgres_url")
    if SCHEMA not in _schema_ready:
        with admin_connect(url) as conn:
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{SCHEMA}"')
        _schema_ready.add(SCHEMA)

        def drop() -> None:
            with admin_connect(url) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')
            _schema_ready.discard(SCHEMA)

        request.config.add_cleanup(drop)
    return url, SCHEMA


def fresh_table_url(request: pytest.FixtureRequest, **options: str) -> str:
    """A store URL naming a new, not yet created table in this run's schema."""
    url, schema = run_schema(request)
    table = f"{schema}.records_{next(_tables)}"
    return with_options(url, table=table, **options)


async def postgres_backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    """A fresh table per test; the URL lets other processes open the same table."""
    url = fresh_table_url(request, max_size="10")
    store = AsyncPostgresStore(url)
    sync = PostgresStore(url)
    await store.ensure_schema()
    try:
        yield Backend("postgres", store, sync, real_sleep, url=url, purge_counts=True)
    finally:
        await store.aclose()
        sync.close()
