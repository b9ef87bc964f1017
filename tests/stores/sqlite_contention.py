"""The SQLite contention rows, for every store that runs on SQLite (the SQLite URL store and
the Django ORM store, sync and async faces).

A holder process runs ``BEGIN IMMEDIATE`` and a write, and keeps the lock until the test tells
it to commit, as a transactional handler does between its first write and its commit. Keys that
already have a record are answered from a read while the lock is still held; new keys (and a
lapsed lease to take over) queue for the lock without blocking an event loop, and win it once it
is free, or fail with a store-unavailable error after the store's bound. Each store's test
module builds its faces (:class:`Face`) and runs the rows below.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from retrysafe import StoreUnavailableError
from retrysafe._core.records import Reservation

__all__ = [
    "Face",
    "Holder",
    "async_face",
    "bounded_wait_row",
    "holding",
    "new_keys_row",
    "records_row",
    "seed",
    "sync_face",
]

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


Reserve = Callable[[str, str, float], Awaitable[Reservation]]


@dataclass
class Face:
    """One face of a SQLite-backed store, as the contention rows drive it.

    Attributes:
        name: for messages (``"sqlite-async"``...).
        reserve: ``reserve(key, fingerprint, lease)`` (a sync face runs in a worker thread, as
            under a threaded WSGI server).
    """

    name: str
    reserve: Reserve


def sync_face(name: str, store: Any) -> Face:
    """A face over a sync store (its calls in a worker thread)."""

    async def reserve(key: str, fp: str, lease: float) -> Reservation:
        return await asyncio.to_thread(store.reserve, key, fp, lease=lease, ttl=60.0)

    return Face(name, reserve)


def async_face(name: str, store: Any) -> Face:
    """A face over an async store."""

    async def reserve(key: str, fp: str, lease: float) -> Reservation:
        result: Reservation = await store.reserve(key, fp, lease=lease, ttl=60.0)
        return result

    return Face(name, reserve)


def seed(store: Any) -> dict[str, str]:
    """Keys in every state, through a sync store: ``running``, ``done``, ``unknown`` decide a
    reservation without a write (returned: key -> state); ``lapsed`` needs the write."""
    running = store.reserve("running", "fp", lease=30.0, ttl=60.0)
    done = store.reserve("done", "fp", lease=30.0, ttl=60.0)
    assert done.token and store.complete("done", done.token, b"stored", ttl=60.0)
    unknown = store.reserve("unknown", "fp", lease=30.0, ttl=60.0)
    assert unknown.token and store.mark_committed("unknown", unknown.token, lease=0.0)
    lapsed = store.reserve("lapsed", "fp", lease=0.001, ttl=60.0)
    assert running.token and lapsed.token
    return {"running": "in_progress", "done": "completed", "unknown": "in_progress"}


async def records_row(face: Face, holder: Holder, expected: dict[str, str]) -> None:
    """Duplicates, replays, outcome unknown and mismatches: answered from a read while the lock
    is held (never waiting for the writer)."""
    for key, state in expected.items():
        answer = await face.reserve(key, "fp", 30.0)
        assert not answer.acquired and answer.record is not None, (face.name, key)
        assert answer.record.state == state, (face.name, key)
    # Another request's body under the same key: the record is still the answer (the
    # middleware turns it into a 422), no write needed.
    other = await face.reserve("running", "other-fp", 30.0)
    assert other.record is not None and other.record.fingerprint == "fp", face.name
    unknown = await face.reserve("unknown", "fp", 30.0)
    assert unknown.record is not None and unknown.record.committed, face.name
    assert unknown.record.lease_remaining == 0.0  # outcome unknown
    # Every answer came while the writer still held the lock: read, not waited.
    assert holder.still_holds(), face.name


async def new_keys_row(face: Face, holder: Holder) -> None:
    """A new key and a lapsed lease queue for the lock (the event loop keeps running) and win
    it once the holder commits."""
    new = asyncio.create_task(face.reserve("new", "fp", 30.0))
    takeover = asyncio.create_task(face.reserve("lapsed", "fp", 30.0))
    ticks = 0
    for _ in range(20):  # the loop runs while they wait
        await asyncio.sleep(0.01)
        ticks += 1
    assert ticks == 20
    assert not new.done() and not takeover.done(), face.name
    assert holder.still_holds()
    holder.release()
    won, taken = await asyncio.wait_for(asyncio.gather(new, takeover), 10)
    assert won.acquired and taken.acquired, face.name


async def bounded_wait_row(
    face: Face, holder: Holder, lease: float = 30.0, match: str = "locked|lock"
) -> None:
    """A new key waits up to the face's bound, then the store is unavailable (the middleware
    answers 503 + Retry-After), while the holder still holds the lock."""
    with pytest.raises(StoreUnavailableError, match=match):
        await face.reserve("new", "fp", lease)
    assert holder.still_holds(), face.name
