"""One store conformance suite, parametrized over every backend (ids: memory, sqlite, postgres,
redis). A backend gives an async store, its sync twin over the same data, a way to move time
forward, and (when the data is shared between processes) a URL another process can open."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
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


@pytest.fixture(
    params=[
        pytest.param("memory", id="memory"),
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres"),
        pytest.param("redis", id="redis"),
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
    else:
        gen = _redis(tmp_path, request)
    async for item in gen:
        yield item


def real_sleep(seconds: float) -> Awaitable[None]:
    """``advance`` for stores that expire on the server's clock."""
    return asyncio.sleep(seconds)


__all__ = ["Backend", "FakeClock", "MemoryStore", "real_sleep"]
