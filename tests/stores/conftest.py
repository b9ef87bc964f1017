"""One store conformance suite, parametrized over every backend (ids: memory, sqlite, postgres,
mysql, redis, redis-cluster, third-party). A backend gives an async store, its sync twin over the
same data, a way to move time forward, and (when the data is shared between processes) a URL
another process can open.

``third-party`` is a backend from outside the package (:mod:`tests.stores.thirdparty`),
registered by its own call and built through the store registry from its URL."""

from __future__ import annotations

import asyncio
import gc
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from retrysafe.stores import (
    AsyncMemoryStore,
    AsyncSQLiteStore,
    AsyncStore,
    MemoryStore,
    SQLiteStore,
    Store,
    async_store_from_url,
    store_from_url,
)

from ..clock import FakeClock
from ..conftest import RUN_ID
from . import thirdparty


@dataclass
class Backend:
    """A store under test."""

    id: str
    store: AsyncStore
    sync_store: Store
    advance: Callable[[float], Awaitable[None]]
    url: str | None = None
    #: False where the server expires records by itself (Redis TTL): purge then finds nothing.
    purge_counts: bool = True


def _fake_time(clock: FakeClock) -> Callable[[float], Awaitable[None]]:
    async def advance(seconds: float) -> None:
        clock.now += seconds

    return advance


async def _memory(tmp_path: Path) -> AsyncIterator[Backend]:
    clock = FakeClock()
    store = AsyncMemoryStore(clock=clock)
    yield Backend("memory", store, store.sync, _fake_time(clock))


async def _sqlite(tmp_path: Path) -> AsyncIterator[Backend]:
    clock = FakeClock()
    path = tmp_path / "conformance.db"
    store = AsyncSQLiteStore(path, clock=clock)
    sync = SQLiteStore(path, clock=clock)
    yield Backend("sqlite", store, sync, _fake_time(clock), url=f"sqlite:///{path}")
    await store.aclose()
    sync.close()


async def _postgres(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    from .backend_postgres import postgres_backend

    async for backend in postgres_backend(request):
        yield backend


async def _mysql(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    from .backend_mysql import mysql_backend

    async for backend in mysql_backend(request):
        yield backend


async def _redis(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    from .backend_redis import redis_backend

    async for backend in redis_backend(request):
        yield backend


async def _third_party() -> AsyncIterator[Backend]:
    with thirdparty.registered():
        url = f"tiny://table-{uuid.uuid4().hex[:8]}?clock_skew=0"
        store = async_store_from_url(url)
        sync = store_from_url(url)
        yield Backend("third-party", store, sync, real_sleep, purge_counts=True)
        await store.aclose()
        sync.close()


async def _redis_cluster(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    from retrysafe.stores.redis_cluster import AsyncRedisClusterStore, RedisClusterStore

    from .cluster import RedisClusterProcs

    procs: RedisClusterProcs = request.getfixturevalue("redis_cluster")
    prefix = f"rs-test-{RUN_ID}-{uuid.uuid4().hex[:8]}:"
    url = f"redis+cluster://{procs.seeds}?prefix={prefix}"
    store = AsyncRedisClusterStore(url)
    sync = RedisClusterStore(url)
    try:
        yield Backend("redis-cluster", store, sync, real_sleep, url=url, purge_counts=False)
    finally:
        await store.aclose()
        sync.close()


@pytest.fixture(
    params=[
        pytest.param("memory", id="memory"),
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres"),
        pytest.param("mysql", id="mysql"),
        pytest.param("redis", id="redis"),
        pytest.param("redis-cluster", id="redis-cluster"),
        pytest.param("third-party", id="third-party"),
    ]
)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    """Every store backend in turn."""
    kind = request.param
    if kind == "memory":
        gen = _memory(tmp_path)
    elif kind == "sqlite":
        gen = _sqlite(tmp_path)
    elif kind == "postgres":
        gen = _postgres(tmp_path, request)
    elif kind == "mysql":
        gen = _mysql(request)
    elif kind == "redis-cluster":
        gen = _redis_cluster(request)
    elif kind == "third-party":
        gen = _third_party()
    else:
        gen = _redis(tmp_path, request)
    async for item in gen:
        yield item


def real_sleep(seconds: float) -> Awaitable[None]:
    """``advance`` for stores that expire on the server's clock."""
    return asyncio.sleep(seconds)


__all__ = ["Backend", "FakeClock", "MemoryStore", "real_sleep"]


@pytest.fixture
def dropped_cluster_nodes() -> Iterator[None]:
    """For tests that fail a Redis Cluster master over: redis-py 5's async cluster client leaves
    the connections of a node it drops from its slot map unclosed (redis/redis-py#3572, fixed in
    7.2 by #3917; arq pins redis-py < 6, so the test environment has 5.x). Their
    ResourceWarnings are ignored during the test (``filterwarnings`` on it) and the leftovers
    are collected at its end, so no later test meets them in a ``gc.collect()``. The store's
    own connections are checked by ``test_slot_map_rereads_leave_no_dropped_node_connected``."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
