"""The SQLite store while another process holds the database's single write lock.

A holder process runs ``BEGIN IMMEDIATE`` and a write, and keeps the lock until the test tells
it to commit, as a transactional handler does between its first write and its commit. Keys that
already have a record are answered from a read while the lock is still held; new keys queue for
the lock (the event loop keeps running) and win it once it is free, or fail with
``SQLiteBusyError`` after the bound: the lease by default, ``busy_timeout`` from the URL.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from retrysafe.stores import AsyncSQLiteStore, SQLiteStore, async_store_from_url
from retrysafe.stores.sqlite import SQLiteBusyError

_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA journal_mode = WAL")
conn.execute("BEGIN IMMEDIATE")
conn.execute("CREATE TABLE IF NOT EXISTS holder_writes (n INTEGER)")
conn.execute("INSERT INTO holder_writes VALUES (1)")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
print("released", flush=True)
"""


class Holder:
    """Another process that holds the write lock of a SQLite file until :meth:`release`."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "locked"
        self.path = path

    def still_holds(self) -> bool:
        """Whether the lock is still taken (another writer cannot begin)."""
        probe = sqlite3.connect(self.path, isolation_level=None, timeout=0)
        try:
            probe.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            assert "locked" in str(exc)
            return True
        finally:
            if probe.in_transaction:
                probe.execute("ROLLBACK")
            probe.close()
        return False

    def release(self) -> None:
        """Commit the holder's transaction and wait for the process to end."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write("go\n")
            self.proc.stdin.flush()
            assert self.proc.stdout.readline().strip() == "released"
            self.proc.wait(timeout=10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()


@contextmanager
def holding(path: Path) -> Iterator[Holder]:
    holder = Holder(path)
    try:
        yield holder
    finally:
        holder.release()


def _records(path: Path) -> dict[str, str]:
    """Keys in every state that decides a reservation without a write; returns key -> state."""
    store = SQLiteStore(path)
    running = store.reserve("running", "fp", lease=30.0, ttl=60.0)
    done = store.reserve("done", "fp", lease=30.0, ttl=60.0)
    assert done.token and store.complete("done", done.token, b"stored", ttl=60.0)
    unknown = store.reserve("unknown", "fp", lease=30.0, ttl=60.0)
    assert unknown.token and store.mark_committed("unknown", unknown.token, lease=0.0)
    lapsed = store.reserve("lapsed", "fp", lease=0.001, ttl=60.0)
    assert running.token and lapsed.token
    store.close()
    return {"running": "in_progress", "done": "completed", "unknown": "in_progress"}


async def test_keys_with_a_record_are_answered_while_another_process_holds_the_lock(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    expected = _records(path)
    store = AsyncSQLiteStore(path)
    sync = SQLiteStore(path)  # the WSGI/CLI face: SQLite's own (blocking) busy wait
    try:
        with holding(path) as holder:
            for face in ("async", "sync"):
                for key, state in expected.items():
                    if face == "async":
                        answer = await store.reserve(key, "fp", lease=30.0, ttl=60.0)
                    else:
                        answer = sync.reserve(key, "fp", lease=30.0, ttl=60.0)
                    assert not answer.acquired and answer.record is not None, (face, key)
                    assert answer.record.state == state, (face, key)
                # Another request's body under the same key: the record is still the answer
                # (the middleware turns it into a 422), no write needed.
                other = await store.reserve("running", "other-fp", lease=30.0, ttl=60.0)
                assert other.record is not None and other.record.fingerprint == "fp"
            unknown = await store.reserve("unknown", "fp", lease=30.0, ttl=60.0)
            assert unknown.record is not None and unknown.record.committed
            assert unknown.record.lease_remaining == 0.0  # outcome unknown
            # Every answer came while the writer still held the lock: read, not waited.
            assert holder.still_holds()
    finally:
        await store.aclose()
        sync.close()


async def test_new_keys_queue_for_the_lock_without_blocking_the_loop(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    _records(path)
    store = AsyncSQLiteStore(path)
    try:
        with holding(path) as holder:
            new = asyncio.create_task(store.reserve("new", "fp", lease=30.0, ttl=60.0))
            # A lapsed lease is taken over by a write: it queues too.
            takeover = asyncio.create_task(store.reserve("lapsed", "fp", lease=30.0, ttl=60.0))
            ticks = 0
            for _ in range(20):  # the loop runs while they wait
                await asyncio.sleep(0.01)
                ticks += 1
            assert ticks == 20
            assert not new.done() and not takeover.done()
            assert holder.still_holds()
            holder.release()
            won, taken = await asyncio.wait_for(asyncio.gather(new, takeover), 10)
        assert won.acquired and taken.acquired
    finally:
        await store.aclose()


async def test_a_new_key_waits_at_most_its_lease_then_the_store_is_busy(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    _records(path)
    store = AsyncSQLiteStore(path)
    try:
        with holding(path) as holder:
            with pytest.raises(SQLiteBusyError, match="write lock"):
                await store.reserve("new", "fp", lease=0.3, ttl=60.0)
            assert holder.still_holds()
    finally:
        await store.aclose()


@pytest.mark.parametrize("face", ["async", "sync"])
async def test_busy_timeout_in_the_url_bounds_the_wait(tmp_path: Path, face: str) -> None:
    path = tmp_path / "s.db"
    _records(path)
    url = f"sqlite:///{path}?busy_timeout=0.2"
    store = async_store_from_url(url) if face == "async" else SQLiteStore.from_url(url)
    assert isinstance(store, AsyncSQLiteStore | SQLiteStore)
    try:
        with holding(path) as holder:
            with pytest.raises(SQLiteBusyError):
                if isinstance(store, AsyncSQLiteStore):
                    await store.reserve("new", "fp", lease=30.0, ttl=60.0)
                else:
                    store.reserve("new", "fp", lease=30.0, ttl=60.0)
            assert holder.still_holds()
    finally:
        if isinstance(store, AsyncSQLiteStore):
            await store.aclose()
        else:
            store.close()


def test_a_bad_busy_timeout_option_is_a_configuration_error(tmp_path: Path) -> None:
    from retrysafe import ConfigurationError

    for value in ("x", "-1", "inf", "nan"):
        with pytest.raises(ConfigurationError, match="busy_timeout"):
            async_store_from_url(f"sqlite:///{tmp_path}/s.db?busy_timeout={value}")
