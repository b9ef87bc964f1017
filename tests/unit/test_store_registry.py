"""Stores chosen by URL: known schemes build stores, unknown ones are a ConfigurationError."""

from __future__ import annotations

import pytest

from retrysafe import ConfigurationError, async_store_from_url, store_from_url
from retrysafe.stores import (
    AsyncMemoryStore,
    AsyncSQLiteStore,
    AsyncStore,
    MemoryStore,
    SQLiteStore,
    Store,
    resolve_async_store,
    resolve_store,
)


def test_memory_url_builds_memory_stores() -> None:
    assert isinstance(store_from_url("memory://"), MemoryStore)
    assert isinstance(async_store_from_url("memory://"), AsyncMemoryStore)


async def test_sqlite_url_builds_a_working_store_at_that_path(tmp_path: object) -> None:
    path = f"{tmp_path}/s.db"
    store = async_store_from_url(f"sqlite:///{path}?busy_timeout=2")
    assert isinstance(store, AsyncSQLiteStore)
    assert store.sync.path == path
    reservation = await store.reserve("rid", "fp", lease=5, ttl=60)
    assert reservation.acquired
    sync = store_from_url(f"sqlite:///{path}")
    assert isinstance(sync, SQLiteStore)
    record = sync.get("rid")
    assert record is not None and record.state == "in_progress"
    sync.close()
    await store.aclose()


@pytest.mark.parametrize(
    "url", ["mongodb://localhost", "memcached://x", "nothing", "", "sqlite:/x"]
)
def test_unknown_scheme_names_the_known_schemes(url: str) -> None:
    for build in (store_from_url, async_store_from_url):
        with pytest.raises(ConfigurationError) as info:
            build(url)
        message = str(info.value)
        for scheme in ("memory://", "sqlite://", "postgresql://", "redis://"):
            assert scheme in message


def test_scheme_is_case_insensitive() -> None:
    assert isinstance(store_from_url("MEMORY://"), MemoryStore)


def test_sqlite_url_without_path_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        store_from_url("sqlite:///")


def test_resolve_accepts_urls_instances_and_local_sync_stores() -> None:
    memory = MemoryStore()
    assert isinstance(resolve_async_store("memory://"), AsyncStore)
    wrapped = resolve_async_store(memory)
    assert isinstance(wrapped, AsyncStore)
    assert getattr(wrapped, "sync", None) is memory
    async_store = AsyncMemoryStore()
    assert resolve_async_store(async_store) is async_store
    assert resolve_store(memory) is memory
    assert isinstance(resolve_store("memory://"), Store)


@pytest.mark.parametrize("thing", [42, object(), None])
def test_resolving_a_non_store_is_a_configuration_error(thing: object) -> None:
    with pytest.raises(ConfigurationError):
        resolve_async_store(thing)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        resolve_store(thing)  # type: ignore[arg-type]


def test_async_store_is_not_accepted_where_a_sync_store_is_needed() -> None:
    with pytest.raises(ConfigurationError):
        resolve_store(AsyncMemoryStore())  # type: ignore[arg-type]
