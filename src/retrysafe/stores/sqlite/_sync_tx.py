# Generated from src/retrysafe/stores/sqlite/_async_tx.py by scripts/unasync.py: do not edit.
"""A request's SQLite transaction on the sync face (transactional mode).

This file is generated from ``_async_tx.py`` by ``scripts/unasync.py``
(``make lint`` checks that it is up to date): edit that file, then run the script. The faces'
stores give it the same three calls: ``_checkout`` (a connection of its own), ``_call`` (a
statement that waits for another writer's lock: an awaited back-off on the async face, SQLite's
own blocking wait on the sync one, where the request has its own thread) and ``_checkin``.
"""

from __future__ import annotations

import sqlite3
import threading
from typing import TYPE_CHECKING

from ._tx import TransactionBase

if TYPE_CHECKING:
    from ._store import SQLiteStore

__all__ = ["SQLiteTransaction"]


class SQLiteTransaction(TransactionBase):
    """A request's SQLite transaction: ``BEGIN IMMEDIATE`` on first use (so the handler's writes
    never wait on a lock mid-way), the fenced completion written and committed in it.

    Args:
        store: the store whose file holds both the records and the application's tables.
    """

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store
        self._conn = None
        self._lock = threading.Lock()  # two concurrent first calls must share one transaction

    def connection(self) -> sqlite3.Connection:
        """Begin the transaction if needed (waiting for the write lock up to the store's
        ``busy_timeout``) and return its connection."""
        with self._lock:
            if self._conn is None:
                conn = self._store._checkout()
                try:
                    self._store._call(self._execute, conn, "BEGIN IMMEDIATE")
                except BaseException:
                    self._store._checkin(conn)
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
        """Roll back anything not committed and give the connection back to the store."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._store._checkin(conn)
