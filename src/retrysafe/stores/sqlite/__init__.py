"""SQLite store: the embedded default. Zero set-up, shared by every process using the file.

Connections are opened lazily, one per thread, in autocommit mode with ``journal_mode=WAL``,
``synchronous=NORMAL`` and a ``busy_timeout``. Every operation is one statement (reserve is an
``INSERT ... ON CONFLICT DO UPDATE ... WHERE ... RETURNING``), so each is atomic under SQLite's
write lock across threads and processes. The async face calls SQLite inline on the event loop;
see :mod:`retrysafe.stores._inline` for why. It never blocks the loop on another writer's lock:
its connections have ``busy_timeout=0`` and a busy statement is retried after an ``await``ed
back-off (:func:`retry_while_busy`) until the store's ``busy_timeout`` runs out (a blocking wait
would freeze the loop, and with it the very request that holds the lock, when that request is in
the same process).

SQLite has one writer at a time, and in transactional mode a handler holds that lock from its
first write to its commit. A reservation that meets the lock taken is still answered at once
when its key already has a record that decides it (in progress, completed, outcome unknown,
another fingerprint): WAL readers never wait for the writer, so that answer comes from a read.
Only a key that needs a write (new, expired, or a lapsed lease to take over) queues for the lock,
by default for as long as the lease it asks for (``busy_timeout`` in the URL overrides it).
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..._core.errors import ConfigurationError, StoreError, StoreUnavailableError
from ..._core.records import (
    Record,
    Reservation,
    instance_id,
    lease_token,
    new_owned_token,
    other_owner,
)
from .._base import StoreStats
from .._inline import InlineAsyncStore
from .._registry import Backend, parse_store_url, register_backend
from .._sql import load_queries, record_from_row, settled_from_row
from .._url import StoreURL, non_negative, split_url
from . import _liveness

__all__ = [
    "DEFAULT_BUSY_TIMEOUT",
    "AsyncSQLiteStore",
    "AsyncSQLiteTransaction",
    "SQLiteBusyError",
    "SQLiteStore",
    "SQLiteTransaction",
    "busy_timeout_option",
    "file_key",
    "parse_sqlite_url",
    "retry_while_busy",
]

_PURGE_BATCH = 1000
_IDLE_TRANSACTION_CONNECTIONS = 8

DEFAULT_BUSY_TIMEOUT = 30.0
"""Seconds a write waits for SQLite's lock when no ``busy_timeout`` is given (and no lease
bounds it): the middleware's default lease, so a request queues about as long as a lease."""

T = TypeVar("T")


class SQLiteBusyError(StoreUnavailableError):
    """Another connection holds the database's write lock (``SQLITE_BUSY``)."""


def _store_error(operation: str, exc: sqlite3.Error) -> StoreError:
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc)
        if "locked" in text or "busy" in text:
            return SQLiteBusyError(f"SQLite {operation}: {text}", store="sqlite")
        return StoreUnavailableError(f"SQLite {operation} failed: {text}", store="sqlite")
    return StoreError(f"SQLite {operation} failed: {exc}", store="sqlite")


def _is_busy(exc: BaseException) -> bool:
    if isinstance(exc, SQLiteBusyError):
        return True
    text = str(exc)
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


class _Turns:
    """The coroutines of one event loop that wait for one SQLite file's write lock, served in
    turn: only the one whose turn it is polls the lock, the others wait in order (the settling
    of a key that is already held before a new reservation, then first come, first served).

    SQLite has no queue of its own: every waiter retries, and one that arrives when the lock is
    free takes it ahead of those that have waited for seconds. On a busy file that is the tail
    of the latency (a request that loses the race again and again); with turns, a waiter
    competes only with the heads of the other processes' queues.
    """

    __slots__ = ("heap", "held", "seq")

    def __init__(self) -> None:
        self.held = False
        self.heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self.seq = itertools.count()

    async def acquire(self, priority: int, within: float) -> bool:
        """Wait for this waiter's turn, at most ``within`` seconds; ``False`` if it did not
        come (then the caller does not hold it)."""
        if not self.held and not self.heap:
            self.held = True
            return True
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self.heap, (priority, next(self.seq), turn))
        try:
            await asyncio.wait((turn,), timeout=within)
        except asyncio.CancelledError:
            self._abandon(turn)
            raise
        if turn.done():
            return True
        self._abandon(turn)
        return False

    def _abandon(self, turn: asyncio.Future[None]) -> None:
        if turn.done():
            self.release()  # handed over just now: pass it on
        else:
            turn.cancel()

    def release(self) -> None:
        """End the current turn: the next waiter's begins."""
        while self.heap:
            turn = heapq.heappop(self.heap)[2]
            if not turn.done():
                turn.set_result(None)
                return
        self.held = False


_TURNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Turns]] = (
    weakref.WeakKeyDictionary()
)

#: Turn priorities: settling a key already held (and a held key's transaction) goes first.
SETTLE, CLAIM = 0, 1


def _turns(path: str) -> _Turns:
    files = _TURNS.setdefault(asyncio.get_running_loop(), {})
    turns = files.get(path)
    if turns is None:
        turns = files[path] = _Turns()
    return turns


async def retry_while_busy(
    operation: Callable[[], T],
    *,
    busy_timeout: float,
    what: str,
    path: str | None = None,
    priority: int = CLAIM,
    settled: Callable[[], T | None] | None = None,
) -> T:
    """Run ``operation`` (SQLite calls on a ``busy_timeout=0`` connection) and, while it meets
    another writer's lock, run it again after an awaited back-off: the event loop keeps serving
    the other requests, among them possibly the one that holds the lock.

    Args:
        operation: raises :class:`SQLiteBusyError` or ``sqlite3.OperationalError`` ("database
            is locked") when the lock is taken; any other error propagates at once.
        busy_timeout: seconds to keep trying (0: one attempt).
        what: the operation's name, for the error message.
        path: the database file: the waiters of this event loop for that file then take turns
            (see :class:`_Turns`) instead of racing each other for the lock.
        priority: :data:`SETTLE` (a key already held) or :data:`CLAIM` (a new write).
        settled: a read that may make the write unnecessary (a reservation whose key got a
            record meanwhile), tried while waiting for a turn; ``None`` from it: keep waiting.

    Returns:
        What ``operation`` returned.

    Raises:
        SQLiteBusyError: the lock stayed taken for ``busy_timeout`` seconds.
    """
    try:
        return operation()
    except (SQLiteBusyError, sqlite3.OperationalError) as exc:
        if not _is_busy(exc):
            raise
        first = exc
    loop = asyncio.get_running_loop()
    deadline = loop.time() + busy_timeout
    turns = None
    if path is not None and path != ":memory:":
        turns = _turns(path)
        while True:
            left = deadline - loop.time()
            if await turns.acquire(priority, min(left, 0.05) if settled else max(0.0, left)):
                break
            if settled is not None:
                try:
                    answer = settled()
                except (SQLiteBusyError, sqlite3.OperationalError) as exc:
                    if not _is_busy(exc):
                        raise
                    answer = None
                if answer is not None:
                    return answer
            if loop.time() >= deadline:
                raise _busy_for(what, busy_timeout) from first
    try:
        delay = 0.0005
        while True:
            now = loop.time()
            if now >= deadline:
                raise _busy_for(what, busy_timeout) from first
            await asyncio.sleep(min(delay, deadline - now))
            # Alone in its turn, a waiter polls often: a free lock is taken within 5 ms.
            delay = min(delay * 2, 0.005 if turns is not None else 0.02)
            try:
                return operation()
            except (SQLiteBusyError, sqlite3.OperationalError) as exc:
                if not _is_busy(exc):
                    raise
    finally:
        if turns is not None:
            turns.release()


def _busy_for(what: str, busy_timeout: float) -> SQLiteBusyError:
    return SQLiteBusyError(
        f"SQLite {what}: the database's write lock stayed taken for {busy_timeout:g} s "
        "(busy_timeout); another transaction holds it",
        store="sqlite",
    )


def file_key(path: str) -> str:
    """The name under which the waiters for ``path``'s write lock take turns (its real path)."""
    return path if path == ":memory:" else os.path.realpath(path)


#: The query options of a ``sqlite:///`` URL: constructor keyword -> converter.
URL_OPTIONS = {"busy_timeout": non_negative}


def _path(url: StoreURL) -> str:
    """The file of a ``sqlite:///relative.db`` / ``sqlite:////abs.db`` URL.

    Raises:
        ConfigurationError: not a sqlite URL, a host given, or no path.
    """
    if url.scheme != "sqlite" or url.location:
        raise ConfigurationError(f"not a sqlite:/// URL: {url.url!r} (sqlite:///file.db)")
    if not url.path:
        raise ConfigurationError("sqlite URL has no path (sqlite:///file.db)")
    return url.path


def parse_sqlite_url(url: str) -> tuple[str, dict[str, str]]:
    """Split ``sqlite:///relative.db`` / ``sqlite:////abs.db`` into (path, raw query options),
    for code that keeps its own tables beside the store's (the demo).

    Raises:
        ConfigurationError: not a sqlite URL or no path.
    """
    split = split_url(url)
    return _path(split), dict(split.passed)


def busy_timeout_option(options: dict[str, str]) -> float | None:
    """The ``busy_timeout`` option of :func:`parse_sqlite_url`'s options in seconds
    (``None`` when absent).

    Raises:
        ConfigurationError: not a number of seconds (>= 0).
    """
    raw = options.get("busy_timeout")
    if raw is None:
        return None
    try:
        return non_negative(raw)
    except ValueError as exc:
        raise ConfigurationError(f"sqlite URL option busy_timeout={raw!r}: {exc}") from None


class SQLiteStore:
    """Keeps records in a SQLite file.

    Args:
        path: the database file (created if missing), or ``":memory:"``.
        busy_timeout: seconds to wait for another writer's lock before failing (SQLite's own
            wait; default :data:`DEFAULT_BUSY_TIMEOUT`). A reservation whose key already has a
            record never waits: it is answered from a read.
        clock: returns the current time in seconds (injectable for tests).
    """

    inline_safe = True
    kind = "sqlite"

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = str(path)
        self._busy_ms = int((DEFAULT_BUSY_TIMEOUT if busy_timeout is None else busy_timeout) * 1000)
        self._clock = clock
        self._local = threading.local()
        self._q = load_queries("retrysafe.stores.sqlite", "sqlite.sql")
        self._schema_lock = threading.Lock()
        self._schema_ready = False
        self._connections: list[sqlite3.Connection] = []
        # Owner liveness: the instance id registered in this file, and this process's identity.
        self._registered = ""
        self._here: _liveness.ProcessIdentity | None = None

    @classmethod
    def from_url(cls, url: str | StoreURL) -> SQLiteStore:
        """Build from ``sqlite:///path.db?busy_timeout=5``."""
        parsed = parse_store_url(url) if isinstance(url, str) else url
        return cls(_path(parsed), **parsed.options)

    def open_connection(self) -> sqlite3.Connection:
        """Open a new connection to the store's file, set up (WAL, schema) and in autocommit.

        Raises:
            StoreError: the file cannot be opened or set up.
        """
        try:
            conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=0
            )
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            if self.path != ":memory:":
                self._use_wal(conn)
            conn.execute("PRAGMA synchronous = NORMAL")
            with self._schema_lock:
                if not self._schema_ready:
                    conn.execute(self._q["create_table"])
                    conn.execute(self._q["create_index"])
                    self._schema_ready = True
        except sqlite3.Error as exc:
            raise _store_error("open", exc) from exc
        self._connections.append(conn)
        return conn

    def _use_wal(self, conn: sqlite3.Connection) -> None:
        # Switching a new file to WAL takes an exclusive lock, and SQLite reports busy at once
        # (no busy handler) when other connections open it at the same moment: try again within
        # the store's busy timeout. With a timeout of 0 (the async face's connections) it raises
        # at once, and the async face retries after an awaited back-off.
        deadline = time.monotonic() + self._busy_ms / 1000
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                text = str(exc)
                if ("locked" not in text and "busy" not in text) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.005)

    def _connect(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self.open_connection()
            self._local.conn = conn
        return conn

    def ensure_schema(self) -> None:
        """Create the table and index now (they are otherwise created on first use)."""
        self._connect()

    def _run(
        self, name: str, params: dict[str, Any], conn: sqlite3.Connection | None = None
    ) -> sqlite3.Cursor:
        try:
            return (conn or self._connect()).execute(self._q[name], params)
        except sqlite3.Error as exc:
            raise _store_error(name, exc) from exc

    _record = staticmethod(record_from_row)

    def _settled(self, record_id: str) -> Reservation | None:
        """The record of ``record_id`` when it decides the reservation without a write (read
        only, so never waiting for the writer); ``None`` when the key needs the write lock."""
        now = self._clock()
        record = settled_from_row(self._run("get", {"id": record_id, "now": now}).fetchone(), now)
        if record is None:
            return None  # new, or a lapsed lease to take over: only the write decides
        if record.state == "in_progress" and self._holder_dead(record_id, now):
            return None  # a dead owner's key: taking it over needs the write
        return Reservation(record=record)

    def _holder_dead(self, record_id: str, now: float) -> bool:
        """Whether the owner of ``record_id``'s in-progress record is known dead (read only)."""
        here = self._here or _liveness.this_process()
        if here is None:
            return False
        row = self._run("holder", {"id": record_id, "now": now}).fetchone()
        if row is None:
            return False
        holder, host, pid, start = row
        if other_owner(holder) is None or host is None:
            return False
        return _liveness.is_dead(_liveness.ProcessIdentity(host, pid, start), here)

    def reserve(self, record_id: str, fingerprint: str, *, lease: float, ttl: float) -> Reservation:
        """See :meth:`retrysafe.stores.Store.reserve`.

        Raises:
            SQLiteBusyError: the key needs a write and another writer holds the lock (after
                ``busy_timeout``; at once on the async face's connections, which retry).
        """
        return self._reserve(record_id, fingerprint, lease, ttl, 0)[0]

    def reserve_committed(
        self, record_id: str, fingerprint: str, *, lease: float, ttl: float
    ) -> tuple[Reservation, bool]:
        """:meth:`reserve`, and a won key is at once marked committed (as by
        :meth:`mark_committed` with ``lease``) in the same statement (the proxy's reservation
        with an upstream connection in hand). Returns the reservation and whether it was
        written committed (a key taken over from a dead owner is not: mark it as usual)."""
        return self._reserve(record_id, fingerprint, lease, ttl, 2)

    def _reserve(
        self, record_id: str, fingerprint: str, lease: float, ttl: float, state: int
    ) -> tuple[Reservation, bool]:
        if self._busy_ms:
            # This connection blocks on the lock: look first, so a key that has a record (a
            # duplicate, a replay) is answered without queueing behind another writer.
            settled = self._settled(record_id)
            if settled is not None:
                return settled, False
        while True:
            now = self._clock()
            try:
                token = self._new_token()  # registers this process in the file once (a write)
                params = {
                    "id": record_id,
                    "fingerprint": fingerprint,
                    "state": state,
                    "token": token,
                    "lease_expires_at": now + lease,
                    "expires_at": now + ttl,
                    "now": now,
                }
                won = self._run("reserve", params).fetchall()
            except SQLiteBusyError:
                # WAL readers never wait for the writer: a key whose record decides is
                # answered now; one that needs the write waits (the caller's back-off).
                settled = self._settled(record_id)
                if settled is None:
                    raise
                return settled, False
            if won:
                return Reservation(token=token), state == 2
            row = self._run("get", {"id": record_id, "now": now}).fetchone()
            if row is not None:
                record = self._record(row, now)
                if record.state != "in_progress" or self._here is None:
                    return Reservation(record=record), False
                found = self._owner_check(record_id, fingerprint, record, lease, ttl, now)
                if found is not None:
                    return found, False
            # Released, purged or taken over between the statements: try again.

    # -- owner liveness (see retrysafe.stores.sqlite._liveness) --------------------------------

    def _new_token(self) -> str:
        """A token naming this process once it is registered in the file, else a plain one."""
        instance = instance_id()
        if self._registered != instance:
            here = _liveness.this_process()
            if here is not None:
                self._run("create_owners", {})
                self._run(
                    "register_owner",
                    {"instance": instance, "host": here.host, "pid": here.pid, "start": here.start},
                )
            self._here = here
            self._registered = instance
        return lease_token(self._here is not None)

    def _owner_check(
        self, record_id: str, fingerprint: str, record: Record, lease: float, ttl: float, now: float
    ) -> Reservation | None:
        """After a conflict with an in-progress record: take it over if its owner is dead.

        Two statements at most, on conflicts only (read the holder; replace it if dead).
        Returns the reservation or record to answer, or ``None`` when the record changed hands
        in between (the caller tries again).
        """
        row = self._run("holder", {"id": record_id, "now": now}).fetchone()
        if row is None:
            return None
        holder, host, pid, start = row
        if other_owner(holder) is None or host is None:
            return Reservation(record=record)
        if not _liveness.is_dead(_liveness.ProcessIdentity(host, pid, start), self._here):
            return Reservation(record=record)
        if record.committed:
            # Effects happened and no one will store the answer: outcome unknown at once.
            return Reservation(record=Record(record.fingerprint, "in_progress", committed=True))
        token = new_owned_token()
        taken = self._run(
            "take_over",
            {
                "id": record_id,
                "holder": holder,
                "fingerprint": fingerprint,
                "token": token,
                "lease_expires_at": now + lease,
                "expires_at": now + ttl,
            },
        ).fetchall()
        return Reservation(token=token) if taken else None

    def _forget_dead_owners(self) -> None:
        if self._here is None:
            return
        for instance, host, pid, start in self._run("owners", {}).fetchall():
            if _liveness.is_dead(_liveness.ProcessIdentity(host, pid, start), self._here):
                self._run("forget_owner", {"instance": instance})

    def renew(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.Store.renew`."""
        params = {"id": record_id, "token": token, "lease_expires_at": self._clock() + lease}
        return self._run("renew", params).rowcount == 1

    def complete(
        self,
        record_id: str,
        token: str,
        response: bytes,
        *,
        ttl: float,
        conn: sqlite3.Connection | None = None,
    ) -> bool:
        """See :meth:`retrysafe.stores.Store.complete`; ``conn`` runs it in that transaction."""
        params = {
            "id": record_id,
            "token": token,
            "response": response,
            "expires_at": self._clock() + ttl,
        }
        return self._run("complete", params, conn).rowcount == 1

    def mark_committed(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.Store.mark_committed`."""
        params = {"id": record_id, "token": token, "lease_expires_at": self._clock() + lease}
        return self._run("mark_committed", params).rowcount == 1

    def delete(self, record_id: str) -> bool:
        """See :meth:`retrysafe.stores.Store.delete`."""
        return self._run("delete", {"id": record_id}).rowcount == 1

    def release(self, record_id: str, token: str) -> bool:
        """See :meth:`retrysafe.stores.Store.release`."""
        return self._run("release", {"id": record_id, "token": token}).rowcount == 1

    def get(self, record_id: str) -> Record | None:
        """See :meth:`retrysafe.stores.Store.get`."""
        now = self._clock()
        row = self._run("get", {"id": record_id, "now": now}).fetchone()
        return None if row is None else self._record(row, now)

    def purge_expired(self) -> int:
        """See :meth:`retrysafe.stores.Store.purge_expired`; deletes in batches."""
        total = 0
        now = self._clock()
        self._forget_dead_owners()
        while True:
            deleted = self._run("purge", {"now": now, "batch": _PURGE_BATCH}).rowcount
            total += deleted
            if deleted < _PURGE_BATCH:
                return total

    def begin(self) -> SQLiteTransaction:
        """Return a transaction (begun on first use) for transactional mode."""
        return SQLiteTransaction(self)

    def forget_connection(self, conn: sqlite3.Connection) -> None:
        """Close a connection from :meth:`open_connection` and stop tracking it."""
        conn.close()
        if conn in self._connections:
            self._connections.remove(conn)

    def stats(self) -> StoreStats:
        """Count the records by state (see :class:`~retrysafe.stores.StoreStats`); one read."""
        return StoreStats.from_row(self._run("stats", {"now": self._clock()}).fetchone())

    def close(self) -> None:
        """Close every connection this store opened."""
        for conn in self._connections:
            conn.close()
        self._connections.clear()
        self._local = threading.local()


class AsyncSQLiteStore(InlineAsyncStore):
    """The async face of :class:`SQLiteStore`: statements run inline on the event loop and wait
    for another writer's lock with an awaited back-off, never a blocking one.

    Args:
        path: the database file.
        busy_timeout: seconds to wait for another writer's lock before failing. ``None``
            (default): a reservation of a new key waits up to its lease, every other write up
            to :data:`DEFAULT_BUSY_TIMEOUT`. A reservation whose key already has a record never
            waits.
        clock: returns the current time in seconds.
    """

    sync: SQLiteStore

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(SQLiteStore(path, busy_timeout=0.0, clock=clock))
        self.busy_timeout = busy_timeout
        self._file = file_key(self.sync.path)
        self._idle: list[sqlite3.Connection] = []

    @classmethod
    def from_url(cls, url: str | StoreURL) -> AsyncSQLiteStore:
        """Build from ``sqlite:///path.db?busy_timeout=5``."""
        parsed = parse_store_url(url) if isinstance(url, str) else url
        return cls(_path(parsed), **parsed.options)

    async def _call(self, operation: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        # Every write but a reservation settles a key already held (or opens its transaction).
        timeout = DEFAULT_BUSY_TIMEOUT if self.busy_timeout is None else self.busy_timeout
        return await retry_while_busy(
            functools.partial(operation, *args, **kwargs),
            busy_timeout=timeout,
            what=getattr(operation, "__name__", "statement"),
            path=self._file,
            priority=SETTLE,
        )

    async def reserve(
        self, record_id: str, fingerprint: str, *, lease: float, ttl: float
    ) -> Reservation:
        """See :meth:`retrysafe.stores.AsyncStore.reserve`: answered at once when the key has a
        record; a new key queues for the write lock up to its lease (or ``busy_timeout``)."""
        timeout = lease if self.busy_timeout is None else self.busy_timeout
        return await retry_while_busy(
            functools.partial(self.sync.reserve, record_id, fingerprint, lease=lease, ttl=ttl),
            busy_timeout=timeout,
            what="reserve",
            path=self._file,
            priority=CLAIM,
            # A duplicate queued behind the first request's reservation is answered from a
            # read as soon as that reservation commits, without waiting for its own turn.
            settled=functools.partial(self.sync._settled, record_id),
        )

    async def reserve_committed(
        self, record_id: str, fingerprint: str, *, lease: float, ttl: float
    ) -> tuple[Reservation, bool]:
        """See :meth:`SQLiteStore.reserve_committed` (waits for the lock as :meth:`reserve`)."""
        timeout = lease if self.busy_timeout is None else self.busy_timeout
        return await retry_while_busy(
            functools.partial(
                self.sync.reserve_committed, record_id, fingerprint, lease=lease, ttl=ttl
            ),
            busy_timeout=timeout,
            what="reserve",
        )

    def begin(self) -> AsyncSQLiteTransaction:
        """Return a transaction (begun on first use) for transactional mode."""
        return AsyncSQLiteTransaction(self)

    def _checkout(self) -> sqlite3.Connection:
        return self._idle.pop() if self._idle else self.sync.open_connection()

    def _checkin(self, conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if len(self._idle) < _IDLE_TRANSACTION_CONNECTIONS:
            self._idle.append(conn)
        else:
            self.sync.forget_connection(conn)

    async def aclose(self) -> None:
        """Close every connection."""
        self._idle.clear()
        self.sync.close()


class _Transaction:
    """What both faces of a request's SQLite transaction share: its connection once begun, the
    fenced completion committed with the handler's writes, the rollback."""

    _conn: sqlite3.Connection | None

    @property
    def begun(self) -> bool:
        """Whether the transaction is open."""
        return self._conn is not None

    @property
    def broken(self) -> bool:
        """Always ``False``: a local file connection does not die under a running request."""
        return False

    @property
    def holds_write_lock(self) -> bool:
        """Whether the transaction is open (``BEGIN IMMEDIATE``: it holds the write lock), so no
        other connection can write the request's record until it ends: its lease needs no
        renewal meanwhile (and a renewal, a write, would queue behind it)."""
        conn = self._conn
        return conn is not None and conn.in_transaction

    @staticmethod
    def _execute(conn: sqlite3.Connection, sql: str) -> None:
        try:
            conn.execute(sql)
        except sqlite3.Error as exc:
            raise _store_error(sql.lower(), exc) from exc

    @classmethod
    def _commit_completion(
        cls,
        store: SQLiteStore,
        conn: sqlite3.Connection,
        record_id: str,
        token: str,
        response: bytes,
        ttl: float,
    ) -> bool:
        if not store.complete(record_id, token, response, ttl=ttl, conn=conn):
            cls._execute(conn, "ROLLBACK")  # fenced out: nothing of this request commits
            return False
        cls._execute(conn, "COMMIT")
        return True

    def _rollback(self) -> None:
        if self._conn is not None and self._conn.in_transaction:
            self._execute(self._conn, "ROLLBACK")


class AsyncSQLiteTransaction(_Transaction):
    """A request's SQLite transaction: ``BEGIN IMMEDIATE`` on first use (so the handler's writes
    never wait on a lock mid-way), the fenced completion written and committed in it.

    Args:
        store: the store whose file holds both the records and the application's tables.
    """

    def __init__(self, store: AsyncSQLiteStore) -> None:
        self._store = store
        self._conn = None
        self._lock = asyncio.Lock()  # two concurrent first calls must share one transaction

    async def connection(self) -> sqlite3.Connection:
        """Begin (waiting for the write lock without blocking the loop) and return the
        connection."""
        async with self._lock:
            if self._conn is None:
                conn = self._store._checkout()
                try:
                    await self._store._call(self._execute, conn, "BEGIN IMMEDIATE")
                except BaseException:
                    self._store._checkin(conn)
                    raise
                self._conn = conn
            return self._conn

    async def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """Write the completion in the transaction and commit; ``False`` (rolled back) when
        fenced out."""
        conn = await self.connection()
        return self._commit_completion(self._store.sync, conn, record_id, token, response, ttl)

    async def rollback(self) -> None:
        """Undo the handler's writes."""
        self._rollback()

    async def close(self) -> None:
        """Return the connection to the idle list."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            self._store._checkin(conn)


class SQLiteTransaction(_Transaction):
    """The sync twin of :class:`AsyncSQLiteTransaction` (WSGI): ``BEGIN IMMEDIATE`` on first use
    on a connection of its own, waiting for another writer's lock up to the store's
    ``busy_timeout`` (a blocking wait is right here: the request has its own thread).

    Args:
        store: the store whose file holds both the records and the application's tables.
    """

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store
        self._conn = None
        self._lock = threading.Lock()  # two concurrent first calls must share one transaction

    def connection(self) -> sqlite3.Connection:
        """Begin the transaction if needed and return its connection."""
        with self._lock:
            if self._conn is None:
                conn = self._store.open_connection()
                try:
                    self._execute(conn, "BEGIN IMMEDIATE")
                except BaseException:
                    self._store.forget_connection(conn)
                    raise
                self._conn = conn
            return self._conn

    def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """Write the completion in the transaction and commit; ``False`` (rolled back) when
        fenced out."""
        conn = self.connection()
        return self._commit_completion(self._store, conn, record_id, token, response, ttl)

    def rollback(self) -> None:
        """Undo the handler's writes."""
        self._rollback()

    def close(self) -> None:
        """Roll back anything not committed and close the connection."""
        conn, self._conn = self._conn, None
        if conn is not None:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self._store.forget_connection(conn)


register_backend(
    Backend(
        name="sqlite",
        schemes=("sqlite",),
        store=SQLiteStore,
        async_store=AsyncSQLiteStore,
        options=URL_OPTIONS,
    )
)
