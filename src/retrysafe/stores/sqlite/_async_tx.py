"""A request's SQLite transaction on the async face (transactional mode).

The sync twin, ``_sync_tx.py``, is generated from this file by ``scripts/unasync.py``
(``make lint`` checks that it is up to date): edit this file, then run the script. The faces'
stores give it the same three calls: ``_checkout`` (a connection of its own), ``_call`` (a
statement that waits for another writer's lock: an awaited back-off on the async face, SQLite's
own blocking wait on the sync one, where the request has its own thread) and ``_checkin``.
"""

from __future__ import annotations

import asyncio
import sqlite3
from typing import TYPE_CHECKING

from ._tx import TransactionBase

if TYPE_CHECKING:
    from ._async_store import AsyncSQLiteStore

__all__ = ["AsyncSQLiteTransaction"]


class AsyncSQLiteTransaction(TransactionBase):
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
        """Begin the transaction if needed (waiting for the write lock up to the store's
        ``busy_timeout``) and return its connection."""
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
        """Roll back anything not committed and give the connection back to the store."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._store._checkin(conn)
