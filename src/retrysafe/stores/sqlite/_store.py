"""The synchronous SQLite store: connections (one per thread), the statements of
``sqlite.sql``, owner liveness (:mod:`._liveness`) and the reservation's read-first path."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..._core.records import (
    Record,
    Reservation,
    instance_id,
    lease_token,
    new_owned_token,
    other_owner,
)
from .._base import StoreStats
from .._fork import INHERITED, reset_after_fork
from .._registry import parse_store_url
from .._sql import load_queries, record_from_row, settled_from_row
from .._url import StoreURL
from . import _liveness
from ._busy import DEFAULT_BUSY_TIMEOUT, SQLiteBusyError, store_error
from ._sync_tx import SQLiteTransaction
from ._url import sqlite_path

__all__ = ["SQLiteStore"]

_PURGE_BATCH = 1000

T = TypeVar("T")


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
        reset_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: the parent's connections are neither used nor closed (SQLite's
        rule: never carry a connection across ``fork``); the child opens its own."""
        INHERITED.append(self._connections)
        self._connections = []
        self._local = threading.local()
        self._schema_lock = threading.Lock()
        self._registered = ""

    @classmethod
    def from_url(cls, url: str | StoreURL) -> SQLiteStore:
        """Build from ``sqlite:///path.db?busy_timeout=5``."""
        parsed = parse_store_url(url) if isinstance(url, str) else url
        return cls(sqlite_path(parsed), **parsed.options)

    def open_connection(self) -> sqlite3.Connection:
        """Open a new connection to the store's file, set up (WAL, schema) and in autocommit.

        Raises:
            StoreError: the file cannot be opened or set up.
        """
        try:
            conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=0
            )
        except sqlite3.Error as exc:
            raise store_error("open", exc) from exc
        try:
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
            conn.close()  # not a database, read-only, locked: never left for the collector
            raise store_error("open", exc) from exc
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
            raise store_error(name, exc) from exc

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

    # What a transaction asks of its store (see _async_tx.py): a connection of its own;
    # a statement that waits for the lock (SQLite's blocking wait: the request has its thread).

    def _checkout(self) -> sqlite3.Connection:
        return self.open_connection()

    def _call(self, operation: Callable[..., T], *args: Any) -> T:
        return operation(*args)

    def _checkin(self, conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        self.forget_connection(conn)

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
