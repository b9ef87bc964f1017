"""The async face of the SQLite store: statements inline on the event loop (see
:mod:`retrysafe.stores._inline`), a writer's lock waited for with an awaited back-off."""

from __future__ import annotations

import functools
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..._core.records import Reservation
from .._fork import reset_after_fork
from .._inline import InlineAsyncStore
from .._registry import parse_store_url
from .._url import StoreURL
from ._async_tx import AsyncSQLiteTransaction
from ._busy import CLAIM, DEFAULT_BUSY_TIMEOUT, SETTLE, file_key, retry_while_busy
from ._store import SQLiteStore
from ._url import sqlite_path

__all__ = ["AsyncSQLiteStore"]

_IDLE_TRANSACTION_CONNECTIONS = 8

T = TypeVar("T")


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
        reset_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: the idle connections are the parent's (the store keeps them)."""
        self._idle = []

    @classmethod
    def from_url(cls, url: str | StoreURL) -> AsyncSQLiteStore:
        """Build from ``sqlite:///path.db?busy_timeout=5``."""
        parsed = parse_store_url(url) if isinstance(url, str) else url
        return cls(sqlite_path(parsed), **parsed.options)

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
