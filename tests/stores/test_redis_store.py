"""Redis-specific behaviour of the Redis store, against real servers.

The shared server (``redis_url``) serves the tests that only read and write their own prefix;
anything that flushes scripts, kills connections or stops a server uses a private redis-server
started by the test.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as redis_asyncio

from retrysafe import ConfigurationError, StoreError, StoreUnavailableError
from retrysafe.stores import async_store_from_url, store_from_url
from retrysafe.stores.redis import AsyncRedisStore, RedisStore, parse_redis_url
from retrysafe.stores.redis._commands import RESERVE

from ..e2e.servers import free_port
from .backend_redis import PrivateRedis, delete_prefixed, unique_prefix, with_prefix

FP = "fp"


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test's own on the shared server, deleted afterwards."""
    name = unique_prefix("unit")
    yield name
    delete_prefixed(redis_url, name)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A redis-server of this test's own (stopped afterwards)."""
    server = PrivateRedis(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture
async def store(redis_url: str, prefix: str) -> AsyncIterator[AsyncRedisStore]:
    """The async store on the shared server, under the test's prefix."""
    s = AsyncRedisStore(with_prefix(redis_url, prefix))
    yield s
    await s.aclose()


# -- URLs and configuration ----------------------------------------------------------------------


def test_url_options_are_parsed_and_stripped_for_redis_py() -> None:
    parsed = parse_redis_url(
        "rediss://user:p%40ss@cache.example:6380/3?prefix={app}:&timeout=0.5&health_check_interval=2"
    )
    assert (parsed.host, parsed.port, parsed.db) == ("cache.example", 6380, 3)
    assert (parsed.username, parsed.password, parsed.tls) == ("user", "p@ss", True)
    assert (parsed.prefix, parsed.timeout, parsed.connect_timeout) == ("{app}:", 0.5, 2.0)
    assert "prefix" not in parsed.client_url and "timeout=" not in parsed.client_url
    assert "health_check_interval=2" in parsed.client_url


def test_default_prefix_and_db() -> None:
    parsed = parse_redis_url("redis://localhost")
    assert (parsed.prefix, parsed.db, parsed.port) == ("retrysafe:", 0, 6379)


@pytest.mark.parametrize(
    "url", ["redis://h/not-a-db", "redis://h?timeout=soon", "redis://h?timeout=0", "memcached://h"]
)
def test_bad_urls_are_configuration_errors(url: str) -> None:
    with pytest.raises(ConfigurationError):
        parse_redis_url(url)


def test_store_urls_select_the_redis_store() -> None:
    assert isinstance(async_store_from_url("redis://127.0.0.1:1/0"), AsyncRedisStore)
    sync = store_from_url("rediss://127.0.0.1:1/0?prefix=x:")
    assert isinstance(sync, RedisStore) and sync.prefix == "x:"
    sync.close()


def test_url_or_client_but_not_both() -> None:
    with pytest.raises(ConfigurationError):
        AsyncRedisStore()
    with pytest.raises(ConfigurationError):
        RedisStore("redis://h", client=redis.Redis())


def test_a_client_that_decodes_responses_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="decode_responses"):
        AsyncRedisStore(client=redis_asyncio.Redis(decode_responses=True))
    with pytest.raises(ConfigurationError, match="decode_responses"):
        RedisStore(client=redis.Redis(decode_responses=True))


# -- records in Redis ----------------------------------------------------------------------------


async def test_records_live_under_the_prefix_with_lease_then_retention_ttl(
    store: AsyncRedisStore, redis_url: str, prefix: str
) -> None:
    check = redis.Redis.from_url(redis_url)
    try:
        won = await store.reserve("rec", FP, lease=5.0, ttl=100.0)
        assert won.token
        assert check.exists(prefix + "rec")
        assert 4000 < check.pttl(prefix + "rec") <= 5000
        assert await store.complete("rec", won.token, b"body", ttl=100.0)
        assert 99000 < check.pttl(prefix + "rec") <= 100000
    finally:
        check.close()


async def test_a_reservation_written_committed_is_what_a_mark_leaves(
    store: AsyncRedisStore, redis_url: str, prefix: str
) -> None:
    """``reserve_committed`` (the proxy's reservation with a connection in hand): one script
    call leaves the record as reserve + mark_committed would; a second caller meets it as
    committed, and the token completes or releases it as usual."""
    check = redis.Redis.from_url(redis_url)
    try:
        won, committed = await store.reserve_committed("c", FP, lease=5.0, ttl=100.0)
        assert committed and won.token
        assert 99000 < check.pttl(prefix + "c") <= 100000  # the retention, as after a mark
        record = await store.get("c")
        assert record is not None and record.committed and record.state == "in_progress"
        assert 4.0 < record.lease_remaining <= 5.0
        other, other_committed = await store.reserve_committed("c", FP, lease=5.0, ttl=100.0)
        assert other.record is not None and other.record.committed and not other_committed
        assert await store.complete("c", won.token, b"body", ttl=100.0)
        released, _ = await store.reserve_committed("r", FP, lease=5.0, ttl=100.0)
        assert released.token and await store.release("r", released.token)
        assert not check.exists(prefix + "r")
    finally:
        check.close()


async def test_lease_remaining_comes_from_the_key_ttl(store: AsyncRedisStore) -> None:
    await store.reserve("lease", FP, lease=10.0, ttl=100.0)
    record = await store.get("lease")
    assert record is not None and record.state == "in_progress"
    assert 9.0 < record.lease_remaining <= 10.0


async def test_in_progress_record_never_outlives_the_retention(store: AsyncRedisStore) -> None:
    won = await store.reserve("short", FP, lease=30.0, ttl=2.0)
    assert won.token
    record = await store.get("short")
    assert record is not None and record.lease_remaining <= 2.0


async def test_prefixes_isolate_stores(redis_url: str, prefix: str) -> None:
    a = AsyncRedisStore(with_prefix(redis_url, prefix + "a:"))
    b = AsyncRedisStore(with_prefix(redis_url, prefix + "b:"))
    try:
        assert (await a.reserve("same-id", FP, lease=5.0, ttl=30.0)).acquired
        assert (await b.reserve("same-id", FP, lease=5.0, ttl=30.0)).acquired
        assert await b.get("other") is None
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_non_record_key_is_a_store_error_not_unavailable(
    store: AsyncRedisStore, redis_url: str, prefix: str
) -> None:
    check = redis.Redis.from_url(redis_url)
    try:
        check.set(prefix + "string", "not a hash")
    finally:
        check.close()
    with pytest.raises(StoreError, match="WRONGTYPE") as info:
        await store.reserve("string", FP, lease=1.0, ttl=1.0)
    assert not isinstance(info.value, StoreUnavailableError)
    sync = RedisStore(with_prefix(redis_url, prefix))
    try:
        with pytest.raises(StoreError, match="WRONGTYPE"):
            sync.get("string")
    finally:
        sync.close()


async def test_purge_has_nothing_to_do(store: AsyncRedisStore, redis_url: str) -> None:
    assert await store.purge_expired() == 0
    sync = RedisStore(redis_url)
    assert sync.purge_expired() == 0
    sync.close()


# -- user-owned clients --------------------------------------------------------------------------


async def test_user_owned_async_client_is_used_and_left_open(redis_url: str, prefix: str) -> None:
    client = redis_asyncio.Redis.from_url(redis_url)
    try:
        store = AsyncRedisStore(client=client, prefix=prefix)
        won = await store.reserve("own", FP, lease=5.0, ttl=30.0)
        assert won.token
        assert await store.complete("own", won.token, b"mine", ttl=30.0)
        await store.aclose()
        assert await client.exists(prefix + "own") == 1  # still open after the store closed
        # The URL store sees the same record: one layout whatever the client.
        url_store = AsyncRedisStore(with_prefix(redis_url, prefix))
        record = await url_store.get("own")
        await url_store.aclose()
        assert record is not None and record.response == b"mine"
    finally:
        await client.aclose()


def test_user_owned_sync_client_is_used_and_left_open(redis_url: str, prefix: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        store = RedisStore(client=client, prefix=prefix)
        won = store.reserve("own", FP, lease=5.0, ttl=30.0)
        assert won.token and store.release("own", won.token)
        store.close()
        assert client.ping()
    finally:
        client.close()


# -- scripts -------------------------------------------------------------------------------------


async def test_scripts_are_reloaded_after_the_server_lost_them(
    private_redis: PrivateRedis,
) -> None:
    """NOSCRIPT (restart, failover, SCRIPT FLUSH) costs one EVAL, never an error."""
    admin = redis.Redis.from_url(private_redis.url)
    lean = AsyncRedisStore(private_redis.url)
    user_client = redis_asyncio.Redis.from_url(private_redis.url)
    via_client = AsyncRedisStore(client=user_client)
    sync = RedisStore(private_redis.url)
    try:
        for n, op in enumerate(
            [
                lambda k: lean.reserve(k, FP, lease=5.0, ttl=30.0),
                lambda k: via_client.reserve(k, FP, lease=5.0, ttl=30.0),
                lambda k: asyncio.to_thread(sync.reserve, k, FP, lease=5.0, ttl=30.0),
            ]
        ):
            admin.script_flush()
            assert (await op(f"a{n}")).acquired
            assert (await op(f"b{n}")).acquired  # cached again by the EVAL fallback
        assert admin.script_exists(RESERVE.sha) == [True]
    finally:
        await lean.aclose()
        await user_client.aclose()
        sync.close()
        admin.close()


# -- faults --------------------------------------------------------------------------------------


async def test_closed_port_is_store_unavailable(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0?connect_timeout=1"
    lean = AsyncRedisStore(url)
    client = redis_asyncio.Redis.from_url(url.split("?")[0])
    via_client = AsyncRedisStore(client=client)
    sync = RedisStore(url)
    try:
        with pytest.raises(StoreUnavailableError):
            await lean.reserve("k", FP, lease=1.0, ttl=1.0)
        with pytest.raises(StoreUnavailableError):
            await lean.get("k")
        with pytest.raises(StoreUnavailableError):
            await via_client.complete("k", "t", b"", ttl=1.0)
        with pytest.raises(StoreUnavailableError):
            sync.release("k", "t")
    finally:
        await lean.aclose()
        await client.aclose()
        sync.close()


async def test_a_server_that_does_not_answer_times_out() -> None:
    """Accepts the connection and reads, never answers: the command fails after ``timeout``."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):
            pass
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store = AsyncRedisStore(f"redis://127.0.0.1:{port}/0?timeout=0.3")
    loop = asyncio.get_running_loop()
    try:
        started = loop.time()
        results = await asyncio.gather(
            *(store.get(f"k{i}") for i in range(5)), return_exceptions=True
        )
        elapsed = loop.time() - started
        assert all(isinstance(r, StoreUnavailableError) for r in results), results
        assert 0.25 < elapsed < 2.0
    finally:
        await store.aclose()
        server.close()
        await server.wait_closed()


async def test_lean_connection_reconnects_after_its_connection_is_killed(
    private_redis: PrivateRedis,
) -> None:
    store = AsyncRedisStore(private_redis.url)
    admin = redis.Redis.from_url(private_redis.url)
    try:
        assert (await store.reserve("k1", FP, lease=5.0, ttl=30.0)).acquired
        assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
        await asyncio.sleep(0.1)  # let the loop see the connection close
        assert (await store.reserve("k2", FP, lease=5.0, ttl=30.0)).acquired
    finally:
        await store.aclose()
        admin.close()


async def test_server_down_then_back_on_the_same_port(private_redis: PrivateRedis) -> None:
    """Down: StoreUnavailableError (never a raw redis error). Back: the next call reconnects."""
    store = AsyncRedisStore(private_redis.url + "?connect_timeout=1")
    sync = RedisStore(private_redis.url + "?connect_timeout=1")
    try:
        assert (await store.reserve("before", FP, lease=5.0, ttl=30.0)).acquired
        assert sync.reserve("before-sync", FP, lease=5.0, ttl=30.0).acquired
        private_redis.stop()
        for _ in range(3):
            with pytest.raises(StoreUnavailableError):
                await store.reserve("down", FP, lease=5.0, ttl=30.0)
            with pytest.raises(StoreUnavailableError):
                sync.reserve("down", FP, lease=5.0, ttl=30.0)
        private_redis.start()
        assert (await store.reserve("after", FP, lease=5.0, ttl=30.0)).acquired
        assert sync.reserve("after-sync", FP, lease=5.0, ttl=30.0).acquired
    finally:
        await store.aclose()
        sync.close()


async def test_cancelled_caller_does_not_shift_the_replies(store: AsyncRedisStore) -> None:
    """Replies are matched by order: a cancelled call's reply is consumed, not given to the next."""
    won = await store.reserve("c", FP, lease=5.0, ttl=30.0)
    assert won.token
    cancelled = asyncio.ensure_future(store.get("c"))
    await asyncio.sleep(0)  # sent, reply not yet read
    cancelled.cancel()
    assert await store.get("missing") is None
    record = await store.get("c")
    assert record is not None and record.fingerprint == FP


def test_the_store_works_across_event_loops(redis_url: str, prefix: str) -> None:
    """One store object, several ``asyncio.run`` calls, each closing it at its end (as a lifespan
    does): each loop gets a connection of its own."""
    store = AsyncRedisStore(with_prefix(redis_url, prefix))

    async def reserve(name: str) -> bool:
        try:
            return (await store.reserve(name, FP, lease=5.0, ttl=30.0)).acquired
        finally:
            await store.aclose()

    assert asyncio.run(reserve("loop-1"))
    assert asyncio.run(reserve("loop-2"))


async def test_concurrent_first_calls_share_one_connection(private_redis: PrivateRedis) -> None:
    store = AsyncRedisStore(private_redis.url)
    admin = redis.Redis.from_url(private_redis.url)
    try:
        results = await asyncio.gather(*(store.get(f"n{i}") for i in range(100)))
        assert results == [None] * 100
        assert len(admin.client_list()) == 2  # the store's one connection and this admin
    finally:
        await store.aclose()
        admin.close()


# -- committed effects and operator deletes --------------------------------------------------------


async def test_committed_record_outlives_its_lease_and_is_never_taken_over(
    store: AsyncRedisStore, redis_url: str, prefix: str
) -> None:
    won = await store.reserve("eff", FP, lease=0.4, ttl=60.0)
    assert won.token
    assert await store.mark_committed("eff", won.token, lease=0.4)
    check = redis.Redis.from_url(redis_url)
    try:
        assert check.pttl(prefix + "eff") > 50_000  # the key now lives for the retention
    finally:
        check.close()
    live = await store.get("eff")
    assert live is not None and live.committed and 0 < live.lease_remaining <= 0.4
    await asyncio.sleep(0.6)
    seen = await store.reserve("eff", FP, lease=5.0, ttl=60.0)
    assert not seen.acquired and seen.record is not None
    assert seen.record.committed and seen.record.state == "in_progress"
    assert seen.record.lease_remaining == 0.0  # outcome unknown
    # The owner, if still alive, can renew, and still complete (fenced by its token).
    assert await store.renew("eff", won.token, lease=5.0)
    renewed = await store.get("eff")
    assert renewed is not None and renewed.lease_remaining > 4.0
    assert not await store.mark_committed("eff", "stale-token", lease=5.0)
    assert await store.complete("eff", won.token, b"done", ttl=60.0)
    done = await store.get("eff")
    assert done is not None and done.state == "completed" and not done.committed
    assert not await store.mark_committed("eff", won.token, lease=5.0)


async def test_committed_record_can_be_released_by_its_owner(store: AsyncRedisStore) -> None:
    won = await store.reserve("rel", FP, lease=5.0, ttl=60.0)
    assert won.token and await store.mark_committed("rel", won.token, lease=5.0)
    assert await store.release("rel", won.token)
    assert await store.get("rel") is None


async def test_delete_removes_a_record_whatever_its_state(
    store: AsyncRedisStore, redis_url: str, prefix: str
) -> None:
    won = await store.reserve("del", FP, lease=5.0, ttl=60.0)
    assert won.token and await store.mark_committed("del", won.token, lease=5.0)
    assert await store.delete("del")
    assert not await store.delete("del")
    assert (await store.reserve("del", FP, lease=5.0, ttl=60.0)).acquired
    sync = RedisStore(with_prefix(redis_url, prefix))
    try:
        assert sync.delete("del") and sync.get("del") is None
        again = sync.reserve("del", FP, lease=5.0, ttl=60.0)
        assert again.token and sync.mark_committed("del", again.token, lease=5.0)
        record = sync.get("del")
        assert record is not None and record.committed
    finally:
        sync.close()
