"""One store conformance suite, parametrized over every backend (ids: memory, sqlite, postgres,
redis, redis-cluster). A backend gives an async store, its sync twin over the same data, a way to
move time forward, and (when the data is shared between processes) a URL another process can
open."""

from __future__ import annotations

import asyncio
import uuid
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
)

from ..clock import FakeClock
from ..conftest import RUN_ID, service_missing
from .cluster import RedisClusterProcs, cluster_binaries


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


async def _redis(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    from .backend_redis import redis_backend

    async for backend in redis_backend(request):
        yield backend


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterProcs]:
    """A real 3-master + 3-replica Redis Cluster on loopback, once per session."""
    if cluster_binaries() is None:
        service_missing("redis-server / redis-cli", "not on PATH (Debian: redis-server)")
    procs = RedisClusterProcs(tmp_path_factory.mktemp("redis-cluster"))
    try:
        yield procs.start()
    finally:
        procs.stop()


async def _redis_cluster(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    from retrysafe.stores.redis_cluster import AsyncRedisClusterStore, RedisClusterStore

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
        pytest.param("redis", id="redis"),
        pytest.param("redis-cluster", id="redis-cluster"),
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
    elif kind == "redis-cluster":
        gen = _redis_cluster(request)
    else:
        gen = _redis(tmp_path, request)
    async for item in gen:
        yield item


def real_sleep(seconds: float) -> Awaitable[None]:
    """``advance`` for stores that expire on the server's clock."""
    return asyncio.sleep(seconds)


__all__ = ["Backend", "FakeClock", "MemoryStore", "real_sleep"]
