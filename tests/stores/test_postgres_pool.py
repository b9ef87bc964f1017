"""The asyncpg pool of the PostgreSQL store never hands out a connection that is dead or in the
middle of an operation (issue 15).

Backends are terminated with ``pg_terminate_backend`` (only this test's own, found by the
``application_name`` of its store URL) while many operations run at once. A backend terminated
while its connection sits idle in the pool leaves asyncpg with a connection that has read the
termination notice but not yet the end of the socket: it looks open, and used, it fails with
"cannot switch to state 12; another operation (2) is in progress".
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections import Counter

import pytest

from retrysafe._core.errors import StoreError
from retrysafe.stores.postgres import AsyncPostgresStore

from .backend_postgres import admin_connect, fresh_table_url

BAD_STATE = ("another operation", "cannot switch to state", "cannot perform operation")


def _pids(url: str, application_name: str) -> set[int]:
    with admin_connect(url) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
            (application_name,),
        ).fetchall()
    return {int(row[0]) for row in rows if isinstance(row[0], int)}


class Killer(threading.Thread):
    """Terminates every backend of one application_name every ``period`` seconds."""

    def __init__(self, url: str, application_name: str, period: float) -> None:
        super().__init__(daemon=True)
        self.url, self.name, self.period = url, application_name, period
        self.stopped = threading.Event()
        self.kills = 0

    def run(self) -> None:
        with admin_connect(self.url) as conn:
            while not self.stopped.wait(self.period):
                rows = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s",
                    (self.name,),
                ).fetchall()
                self.kills += len(rows)

    def stop(self) -> None:
        self.stopped.set()
        self.join(10)


async def test_terminated_backends_under_load_leave_no_dead_or_busy_connection_in_the_pool(
    request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    name = f"rs-pool-{uuid.uuid4().hex[:8]}"
    url = fresh_table_url(request, application_name=name, max_size="5")
    store = AsyncPostgresStore(url)
    await store.ensure_schema()
    errors: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    done = Counter[str]()
    stop = asyncio.Event()

    async def plain(n: int) -> None:
        while not stop.is_set():
            rid = f"{name}:{uuid.uuid4().hex}"
            try:
                won = await store.reserve(rid, "fp", lease=30.0, ttl=60.0)
                assert won.token is not None
                await store.complete(rid, won.token, b"answer", ttl=60.0)
                record = await store.get(rid)
                assert record is not None and record.state == "completed"
                done["plain"] += 1
            except StoreError as exc:
                errors[str(exc)] += 1
                kinds[type(exc).__name__] += 1
            await asyncio.sleep(0.001 * (n % 3))

    async def transactional() -> None:
        while not stop.is_set():
            rid = f"{name}:{uuid.uuid4().hex}"
            tx = store.begin()
            try:
                won = await store.reserve(rid, "fp", lease=30.0, ttl=60.0)
                assert won.token is not None
                conn = await tx.connection()
                try:
                    await conn.fetchval("SELECT 1")
                except Exception:
                    # The handler's own statement on a connection killed under it: the
                    # transaction is gone (the flow answers 503); ours must end it cleanly.
                    await tx.rollback()
                    continue
                assert await tx.complete(rid, won.token, b"answer", ttl=60.0)
                done["transactional"] += 1
            except StoreError as exc:
                errors[str(exc)] += 1
                kinds[type(exc).__name__] += 1
            finally:
                await tx.close()

    killer = Killer(url, name, 0.05)
    caplog.set_level(logging.WARNING)
    try:
        workers = [asyncio.create_task(plain(n)) for n in range(8)]
        workers += [asyncio.create_task(transactional()) for _ in range(2)]
        await asyncio.sleep(0.3)
        killer.start()
        await asyncio.sleep(2.5)
        killer.stop()
        stop.set()
        await asyncio.wait_for(asyncio.gather(*workers), 30)
        assert killer.kills > 20, "the fault hardly hit the pool"
        assert done["plain"] and done["transactional"]
        # During the faults: failures only of the "unavailable, retry" kind (a 503), never a
        # connection handed out mid-operation.
        assert not [e for e in errors if any(text in e for text in BAD_STATE)], errors
        assert set(kinds) <= {"StoreUnavailableError", "ConnectionLostError"}, kinds

        # After recovery every operation succeeds, one at a time and many at once.
        for _ in range(20):
            rid = f"{name}:{uuid.uuid4().hex}"
            won = await store.reserve(rid, "fp", lease=30.0, ttl=60.0)
            assert won.token and await store.complete(rid, won.token, b"a", ttl=60.0)

        async def one() -> bool:
            rid = f"{name}:{uuid.uuid4().hex}"
            won = await store.reserve(rid, "fp", lease=30.0, ttl=60.0)
            return won.token is not None and await store.release(rid, won.token)

        assert all(await asyncio.gather(*(one() for _ in range(30))))
    finally:
        killer.stop()
        stop.set()
        await store.aclose()
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("retrysafe")]
    logged += [r.getMessage() for r in caplog.records if r.name.startswith("asyncpg")]
    assert not [m for m in logged if any(text in m for text in BAD_STATE)], logged
    print(f"kills {killer.kills}, done {dict(done)}, failures during faults {sum(errors.values())}")


async def test_a_cancelled_operation_discards_its_connection(
    request: pytest.FixtureRequest,
) -> None:
    """A statement cancelled while it runs (here: waiting on a table lock) never goes back to
    the pool; its backend ends once the server gets to it, and the store keeps working."""
    name = f"rs-cancel-{uuid.uuid4().hex[:8]}"
    url = fresh_table_url(request, application_name=name, max_size="2")
    store = AsyncPostgresStore(url)
    await store.ensure_schema()
    table = url.split("table=", 1)[1].split("&", 1)[0]
    try:
        assert await store.get("warm") is None
        with admin_connect(url) as locker:
            locker.execute("BEGIN")
            locker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            blocked = asyncio.create_task(store.get("waits-on-the-lock"))
            waiting: set[int] = set()
            for _ in range(100):
                await asyncio.sleep(0.02)
                rows = locker.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
                    "AND wait_event_type = 'Lock'",
                    (name,),
                ).fetchall()
                waiting = {int(row[0]) for row in rows if isinstance(row[0], int)}
                if waiting:
                    break
            assert waiting, "the statement never waited on the lock"
            blocked.cancel()
            with pytest.raises(asyncio.CancelledError):
                await blocked
            locker.execute("ROLLBACK")
        for _ in range(100):  # the backend ends when it next talks to its (closed) client
            if not waiting & _pids(url, name):
                break
            await asyncio.sleep(0.02)
        assert not waiting & _pids(url, name), "the cancelled connection was kept"
        assert await store.get("after") is None
        assert not waiting & _pids(url, name)
    finally:
        await store.aclose()


async def test_a_transaction_cancelled_mid_statement_never_goes_back_busy(
    request: pytest.FixtureRequest,
) -> None:
    """A handler cancelled in the middle of a statement on its transaction's connection: the
    transaction closes without error, and the connection is either discarded or back to idle
    with the transaction rolled back (asyncpg had the server cancel the statement), never
    handed out still running it."""
    name = f"rs-cancel-tx-{uuid.uuid4().hex[:8]}"
    url = fresh_table_url(request, application_name=name, max_size="1")
    store = AsyncPostgresStore(url)
    await store.ensure_schema()
    try:
        tx = store.begin()
        conn = await tx.connection()
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        handler = asyncio.create_task(conn.execute("SELECT pg_sleep(30)"))
        await asyncio.sleep(0.2)
        handler.cancel()
        with pytest.raises(asyncio.CancelledError):
            await handler
        await tx.close()  # must not raise
        with admin_connect(url) as admin:
            row = admin.execute(
                "SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone()
        assert row is None or row[0] == "idle", row
        # The pool's only connection slot serves the next request at once.
        nxt = store.begin()
        conn = await asyncio.wait_for(nxt.connection(), 5)
        assert await conn.fetchval("SELECT 1") == 1
        await nxt.close()
        assert await store.get("after") is None
    finally:
        await store.aclose()
