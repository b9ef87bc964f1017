"""Stores for the call tests: every backend by URL (ids memory, sqlite, postgres, mysql, redis), so
the same URL opens the sync face, the async face, and (except memory) the same records from
another process. Each test gets fresh records: a new SQLite file, PostgreSQL or MySQL table or
Redis prefix."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..stores import backend_mysql
from ..stores.backend_postgres import fresh_table_url
from ..stores.backend_redis import delete_prefixed, unique_prefix, with_prefix


@dataclass(frozen=True)
class StoreURL:
    """A store under test, named by URL."""

    id: str
    url: str

    @property
    def shared(self) -> bool:
        """Whether other processes see the same records (every store but memory)."""
        return self.id != "memory"

    @property
    def sql(self) -> bool:
        """Whether the store has transactional mode."""
        return self.id in ("sqlite", "postgres", "mysql")


def make_store_url(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreURL]:
    """A fresh store of ``kind``; its records are deleted afterwards."""
    if kind == "memory":
        yield StoreURL(kind, "memory://")
    elif kind == "sqlite":
        yield StoreURL(kind, f"sqlite:///{tmp_path}/calls.db")
    elif kind == "postgres":
        yield StoreURL(kind, fresh_table_url(request, max_size="20"))
    elif kind == "mysql":
        yield StoreURL(kind, backend_mysql.fresh_table_url(request, max_size="20"))
    else:
        base: str = request.getfixturevalue("redis_url")
        prefix = unique_prefix("calls")
        try:
            yield StoreURL(kind, with_prefix(base, prefix))
        finally:
            delete_prefixed(base, prefix)


ALL = [pytest.param(kind, id=kind) for kind in ("memory", "sqlite", "postgres", "redis")]
SHARED = [pytest.param(kind, id=kind) for kind in ("sqlite", "postgres", "redis")]
SQL = [pytest.param(kind, id=kind) for kind in ("sqlite", "postgres", "mysql")]


@pytest.fixture(params=ALL)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreURL]:
    """Every store in turn."""
    yield from make_store_url(request.param, request, tmp_path)


@pytest.fixture(params=SHARED)
def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreURL]:
    """Every store whose records other processes see."""
    yield from make_store_url(request.param, request, tmp_path)


@pytest.fixture(params=SQL)
def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreURL]:
    """Every store with transactional mode."""
    yield from make_store_url(request.param, request, tmp_path)
