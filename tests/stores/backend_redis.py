"""The Redis backend of the conformance suite: the real server, a key prefix unique to the test."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from retrysafe.stores.redis import AsyncRedisStore, RedisStore

from ..conftest import RUN_ID
from .conftest import Backend, real_sleep


def with_prefix(url: str, prefix: str) -> str:
    """Add ``?prefix=`` to a Redis URL (keeping any query it has)."""
    return f"{url}{'&' if '?' in url else '?'}prefix={prefix}"


def delete_prefixed(url: str, prefix: str) -> int:
    """Delete the keys under ``prefix`` only (never FLUSHDB: the server is shared)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        return int(client.delete(*keys)) if keys else 0
    finally:
        client.close()


def unique_prefix(tag: str = "test") -> str:
    """A key prefix no other test or run uses."""
    return f"rs-{tag}-{RUN_ID}-{uuid.uuid4().hex[:8]}:"


async def redis_backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    """Yield the Redis async store and its sync twin over one prefix; delete the prefix after."""
    base: str = request.getfixturevalue("redis_url")
    prefix = unique_prefix()
    url = with_prefix(base, prefix)
    store = AsyncRedisStore(url)
    sync = RedisStore(url)
    try:
        yield Backend("redis", store, sync, real_sleep, url=url, purge_counts=False)
    finally:
        await store.aclose()
        sync.close()
        delete_prefixed(base, prefix)
