"""PostgreSQL-specific behaviour of the PostgreSQL store, against the real server."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from retrysafe._core.errors import ConfigurationError, StoreError, StoreUnavailableError
from retrysafe.cli import main
from retrysafe.stores import async_store_from_url, store_from_url
from retrysafe.stores.postgres import AsyncPostgresStore, PostgresStore
from retrysafe.stores.postgres._sql import PostgresOptions, Query, Rows

from ..e2e.servers import free_port
from .backend_postgres import admin_connect, fresh_table_url, with_options

FP = "fp"


def _terminate(url: str, application_name: str) -> int:
    """pg_terminate_backend every backend of one application_name (a test's own store)."""
    with admin_connect(url) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = %s AND pid <> pg_backend_pid()",
            (application_name,),
        ).fetchall()
    return len(rows)


def _table_exists(url: str, table: str) -> bool:
    with admin_connect(url) as conn:
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()
    return bool(row and row[0])


def _count_statements(store: AsyncPostgresStore, name: str) -> list[int]:
    """Count how many times ``store`` sends statement ``name`` (wraps its driver's perform)."""
    sent = [0]
    real = store._driver.perform

    async def counting(query: Query) -> Rows:
        if query.statement.name == name:
            sent[0] += 1
        return await real(query)

    store._driver.perform = counting  # type: ignore[method-assign]
    return sent


async def test_reserve_retries_when_a_concurrent_insert_commits_mid_statement(
    request: pytest.FixtureRequest,
) -> None:
    """The reserve-or-read statement returns no row when a concurrent insert commits after its
    snapshot; the store runs it again and returns the committed record."""
    url = fresh_table_url(request)
    store = AsyncPostgresStore(url)
    await store.ensure_schema()
    table = store.options.quoted_table
    sent = _count_statements(store, "reserve")
    try:
        with admin_connect(url) as other:
            other.execute("BEGIN")
            other.execute(
                f"INSERT INTO {table} (id, fingerprint, state, token, lease_expires_at, "
                "expires_at) VALUES ('k', 'theirs', 0, 't', now() + interval '30 s', "
                "now() + interval '60 s')"
            )
            # Our statement takes its snapshot now (row not visible), then waits on the
            # uncommitted conflicting row.
            pending = asyncio.create_task(store.reserve("k", "mine", lease=5.0, ttl=60.0))
            await asyncio.sleep(0.5)
            assert not pending.done()
            other.execute("COMMIT")
            result = await asyncio.wait_for(pending, 10)
        assert not result.acquired
        assert result.record is not None and result.record.fingerprint == "theirs"
        assert result.record.state == "in_progress"
        assert sent[0] == 2, "the first attempt must have come back empty and been retried"
    finally:
        await store.aclose()


async def test_takeover_race_is_retried_too(request: pytest.FixtureRequest) -> None:
    """A lapsed lease taken over by a concurrent transaction that commits mid-statement."""
    url = fresh_table_url(request)
    store = AsyncPostgresStore(url)
    await store.ensure_schema()
    table = store.options.quoted_table
    crashed = await store.reserve("k", FP, lease=0.2, ttl=60.0)
    assert crashed.token
    await asyncio.sleep(0.4)
    try:
        with admin_connect(url) as other:
            other.execute("BEGIN")
            other.execute(
                f"UPDATE {table} SET token = 'theirs', fingerprint = 'theirs', "
                "lease_expires_at = now() + interval '30 s' WHERE id = 'k'"
            )
            pending = asyncio.create_task(store.reserve("k", FP, lease=5.0, ttl=60.0))
            await asyncio.sleep(0.5)
            other.execute("COMMIT")
            result = await asyncio.wait_for(pending, 10)
        assert not result.acquired
        assert result.record is not None and result.record.fingerprint == "theirs"
    finally:
        await store.aclose()


async def test_many_concurrent_reservations_of_one_key_across_pools(
    request: pytest.FixtureRequest,
) -> None:
    """4 pools x 50 tasks, 20 keys in turn: always exactly one winner, never an error."""
    url = fresh_table_url(request)
    stores = [AsyncPostgresStore(url) for _ in range(4)]
    await stores[0].ensure_schema()
    sent = [_count_statements(store, "reserve") for store in stores]
    try:
        for store in stores:
            await store.get("warm-up")
        for n in range(20):
            key = f"hot-{n}"
            results = await asyncio.gather(
                *(s.reserve(key, FP, lease=30.0, ttl=60.0) for s in stores for _ in range(50))
            )
            assert sum(r.acquired for r in results) == 1
            assert all(r.record is not None for r in results if not r.acquired)
        # Statements beyond one per call are the mid-statement race being retried.
        print(f"reserve statements: {sum(c[0] for c in sent)} for {20 * 200} calls")
    finally:
        for store in stores:
            await store.aclose()


async def test_ensure_schema_is_idempotent_and_safe_concurrently(
    request: pytest.FixtureRequest,
) -> None:
    url = fresh_table_url(request, auto_create="false")
    stores = [AsyncPostgresStore(url) for _ in range(4)]
    try:
        await asyncio.gather(*(s.ensure_schema() for s in stores))
        await stores[0].ensure_schema()
        sync = PostgresStore(url)
        sync.ensure_schema()
        sync.ensure_schema()
        sync.close()
        assert (await stores[0].reserve("k", FP, lease=5.0, ttl=60.0)).acquired
    finally:
        for store in stores:
            await store.aclose()


async def test_auto_create_makes_the_table_on_first_use(request: pytest.FixtureRequest) -> None:
    url = fresh_table_url(request)
    table = PostgresOptions.from_url(url).table
    assert not _table_exists(url, table)
    store = async_store_from_url(url)
    try:
        assert (await store.reserve("k", FP, lease=5.0, ttl=60.0)).acquired
    finally:
        await store.aclose()
    assert _table_exists(url, table)


async def test_without_auto_create_a_missing_table_is_a_store_error(
    request: pytest.FixtureRequest,
) -> None:
    url = fresh_table_url(request, auto_create="false")
    store = AsyncPostgresStore(url)
    sync = PostgresStore(url)
    try:
        with pytest.raises(StoreError) as caught:
            await store.get("k")
        assert not isinstance(caught.value, StoreUnavailableError)
        with pytest.raises(StoreError):
            sync.get("k")
        await store.ensure_schema()
        assert await store.get("k") is None
        assert sync.get("k") is None
    finally:
        await store.aclose()
        sync.close()


def test_url_options_are_parsed_and_the_rest_goes_to_the_driver() -> None:
    options = PostgresOptions.from_url(
        "postgresql://u@h:5/db?table=s.t&min_size=2&max_size=7&auto_create=false"
        "&pool_timeout=1.5&connect_timeout=3&synchronous_commit=off&application_name=x"
        "&sslmode=disable"
    )
    assert options.table == "s.t" and options.quoted_table == '"s"."t"'
    assert (options.min_size, options.max_size) == (2, 7)
    assert options.auto_create is False
    assert (options.pool_timeout, options.connect_timeout) == (1.5, 3.0)
    assert options.synchronous_commit == "off"
    assert options.application_name == "x"
    assert options.dsn == "postgresql://u@h:5/db?sslmode=disable"
    assert PostgresOptions.from_url("postgres://h/db").table == "retrysafe_records"


@pytest.mark.parametrize(
    "query",
    [
        "table=a;drop",
        'table=a"b',
        "table=a.b.c",
        "table=",
        "table=1abc",
        "max_size=0",
        "min_size=5&max_size=2",
        "max_size=many",
        "auto_create=maybe",
        "synchronous_commit=sometimes",
        "pool_timeout=0",
    ],
)
def test_bad_url_options_fail_at_start_up(query: str) -> None:
    with pytest.raises(ConfigurationError):
        AsyncPostgresStore(f"postgresql://h/db?{query}")
    with pytest.raises(ConfigurationError):
        PostgresStore(f"postgresql://h/db?{query}")


async def test_synchronous_commit_option_applies_to_the_stores_writes(
    request: pytest.FixtureRequest,
) -> None:
    """Opt-in synchronous_commit=off: writes work; the setting does not leak into the session."""
    url = fresh_table_url(request, synchronous_commit="off", max_size="1")
    store = AsyncPostgresStore(url)
    sync = PostgresStore(url)
    try:
        won = await store.reserve("k", FP, lease=5.0, ttl=60.0)
        assert won.token and await store.renew("k", won.token, lease=5.0)
        assert await store.complete("k", won.token, b"r", ttl=60.0)
        pool = store._driver._pool
        async with pool.acquire() as conn:
            # set_config(..., true) is transaction-local: the pooled session keeps the default.
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
        assert sync.reserve("k2", FP, lease=5.0, ttl=60.0).acquired
    finally:
        await store.aclose()
        sync.close()


async def test_idle_connections_terminated_by_the_server_are_replaced(
    request: pytest.FixtureRequest,
) -> None:
    """pg_terminate_backend of the store's idle backends: the next operations just work."""
    name = f"rs-idle-{uuid.uuid4().hex[:8]}"
    url = fresh_table_url(request, application_name=name, min_size="2")
    store = AsyncPostgresStore(url)
    sync = PostgresStore(url)
    try:
        assert (await store.reserve("a", FP, lease=5.0, ttl=60.0)).acquired
        assert sync.reserve("b", FP, lease=5.0, ttl=60.0).acquired
        assert _terminate(url, name) >= 2
        await asyncio.sleep(0.2)
        assert (await store.reserve("c", FP, lease=5.0, ttl=60.0)).acquired
        assert sync.reserve("d", FP, lease=5.0, ttl=60.0).acquired
        assert sync.get("c") is not None and await store.get("d") is not None
    finally:
        await store.aclose()
        sync.close()


async def test_connection_lost_mid_statement_is_unavailable_then_recovers(
    request: pytest.FixtureRequest,
) -> None:
    """A complete blocked on a row lock loses its connection twice (first attempt and its
    retry): StoreUnavailableError, not a driver exception. Then the store works again."""
    name = f"rs-lost-{uuid.uuid4().hex[:8]}"
    url = fresh_table_url(request, application_name=name)
    store = AsyncPostgresStore(url)
    await store.ensure_schema()
    table = store.options.quoted_table
    try:
        won = await store.reserve("k", FP, lease=30.0, ttl=60.0)
        assert won.token
        with admin_connect(url) as locker:
            locker.execute("BEGIN")
            locker.execute(f"SELECT 1 FROM {table} WHERE id = 'k' FOR UPDATE")
            pending = asyncio.create_task(store.complete("k", won.token, b"r", ttl=60.0))
            for _ in range(2):
                await asyncio.sleep(0.5)
                assert _terminate(url, name) >= 1
            with pytest.raises(StoreUnavailableError):
                await asyncio.wait_for(pending, 10)
            locker.execute("ROLLBACK")
        # Recovery: fresh connections, and the reservation is still completable.
        assert await store.complete("k", won.token, b"r", ttl=60.0)
        record = await store.get("k")
        assert record is not None and record.response == b"r"
    finally:
        await store.aclose()


async def test_complete_retried_after_a_lost_connection_recognises_its_own_success(
    request: pytest.FixtureRequest,
) -> None:
    """The connection breaks while the first complete waits; the retry succeeds."""
    name = f"rs-retry-{uuid.uuid4().hex[:8]}"
    url = fresh_table_url(request, application_name=name)
    store = AsyncPostgresStore(url)
    await store.ensure_schema()
    table = store.options.quoted_table
    try:
        won = await store.reserve("k", FP, lease=30.0, ttl=60.0)
        assert won.token
        with admin_connect(url) as locker:
            locker.execute("BEGIN")
            locker.execute(f"SELECT 1 FROM {table} WHERE id = 'k' FOR UPDATE")
            pending = asyncio.create_task(store.complete("k", won.token, b"r", ttl=60.0))
            await asyncio.sleep(0.5)
            assert _terminate(url, name) >= 1
            await asyncio.sleep(0.3)
            locker.execute("ROLLBACK")
        assert await asyncio.wait_for(pending, 10)
    finally:
        await store.aclose()


async def test_unreachable_port_is_unavailable_quickly() -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/test?pool_timeout=1"
    store = AsyncPostgresStore(url)
    sync = PostgresStore(url)
    try:
        for attempt in range(2):
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError):
                await store.reserve(f"k{attempt}", FP, lease=5.0, ttl=60.0)
            with pytest.raises(StoreUnavailableError):
                sync.reserve(f"k{attempt}", FP, lease=5.0, ttl=60.0)
            assert time.monotonic() - started < 2.0
    finally:
        await store.aclose()
        sync.close()


def test_cli_schema_apply_check_and_purge(
    request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    url = fresh_table_url(request, auto_create="false")
    table = PostgresOptions.from_url(url).table
    assert main(["schema", "apply", "--store", url]) == 0
    assert _table_exists(url, table)
    assert main(["schema", "apply", "--store", url]) == 0
    assert main(["check", "--store", url]) == 0
    store = store_from_url(url)
    try:
        for n in range(3):
            won = store.reserve(f"old-{n}", FP, lease=5.0, ttl=60.0)
            assert won.token and store.complete(f"old-{n}", won.token, b"r", ttl=0.01)
        time.sleep(0.1)
    finally:
        store.close()
    capsys.readouterr()
    assert main(["purge", "--store", url]) == 0
    assert "purged 3 expired records" in capsys.readouterr().out
    unreachable = f"postgresql://127.0.0.1:{free_port()}/test"
    assert main(["check", "--store", unreachable]) == 2


def test_with_options_helper_keeps_existing_query() -> None:
    assert with_options("postgresql://h/db?a=1", b="2") == "postgresql://h/db?a=1&b=2"


async def test_committed_record_is_never_taken_over_and_delete_removes_it(
    request: pytest.FixtureRequest,
) -> None:
    url = fresh_table_url(request)
    store = AsyncPostgresStore(url)
    sync = PostgresStore(url)
    try:
        won = await store.reserve("k", FP, lease=0.3, ttl=60.0)
        assert won.token and await store.mark_committed("k", won.token, lease=0.3)
        await asyncio.sleep(0.5)
        again = await store.reserve("k", FP, lease=5.0, ttl=60.0)
        assert not again.acquired and again.record is not None
        assert again.record.committed and again.record.lease_remaining == 0.0
        got = sync.get("k")
        assert got is not None and got.committed
        assert await store.complete("k", won.token, b"late", ttl=60.0)
        assert sync.delete("k") and not await store.delete("k")
        assert (await store.reserve("k", FP, lease=5.0, ttl=60.0)).acquired
    finally:
        await store.aclose()
        sync.close()
