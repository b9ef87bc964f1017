"""What both faces of a request's SQLite transaction share (hand-written; the faces themselves
are ``_async_tx.py`` and its generated twin ``_sync_tx.py``)."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from ._busy import store_error

if TYPE_CHECKING:
    from ._store import SQLiteStore

__all__ = ["TransactionBase"]


class TransactionBase:
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
            raise store_error(sql.lower(), exc) from exc

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
