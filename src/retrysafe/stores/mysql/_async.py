"""The async MySQL store: the store's logic over the asyncmy driver (``_asyncmy.py``).

Each operation is a generator of ``_sql.py`` run by the one action loop, its statements sent
through the driver; the driver owns the pool, the owner lock and the connection of a request's
transaction.

The sync twin, ``_sync.py`` (PyMySQL), is generated from this file by ``scripts/unasync.py``
(``make lint`` checks that it is up to date): edit this file, then run the script.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..._core.drive import drive
from ..._core.records import Record, Reservation
from .._base import StoreStats
from .._url import StoreURL
from ._asyncmy import AsyncmyDriver
from ._sql import (
    MySQLOptions,
    Query,
    Rows,
    Statements,
    complete_op,
    delete_op,
    get_op,
    mark_committed_op,
    purge_op,
    release_op,
    renew_op,
    reserve_op,
    stats_op,
)

__all__ = ["AsyncMySQLStore", "AsyncMySQLTransaction"]


class AsyncMySQLStore:
    """Keeps records in a MySQL or MariaDB table, through pooled asyncmy connections.

    The pool is opened on first use. With ``auto_create`` (default) the table is created then
    if it is missing.

    Args:
        url: ``mysql://user:password@host:port/database?option=value``; see
            :class:`~retrysafe.stores.mysql.MySQLOptions` for the options.
        **options: the same options as keywords (they win over the URL's).

    Raises:
        ConfigurationError: an unknown option, or an option with a bad value.
    """

    kind = "mysql"

    def __init__(self, url: str | StoreURL, **options: Any) -> None:
        self.options = MySQLOptions.from_url(url, **options)
        self.statements = Statements(self.options)
        self._driver = AsyncmyDriver(self.options, self.statements)

    @classmethod
    def from_url(cls, url: str | StoreURL) -> AsyncMySQLStore:
        """Build from ``mysql://...?table=...``."""
        return cls(url)

    async def ensure_schema(self) -> None:
        """Create the table and its expiry index if missing (idempotent).

        ``retrysafe schema apply --store URL`` calls this.

        Raises:
            StoreError: the server refused (e.g. no CREATE right on the schema).
            StoreUnavailableError: the server cannot be reached.
        """
        await self._driver.ensure_schema()

    async def reserve(
        self, record_id: str, fingerprint: str, *, lease: float, ttl: float
    ) -> Reservation:
        """See :meth:`retrysafe.stores.AsyncStore.reserve`."""
        driver = self._driver
        owned = driver.owner_held() or await driver.hold_owner_lock()
        op = reserve_op(self.statements, record_id, fingerprint, lease=lease, ttl=ttl, owned=owned)
        return await drive(op, driver)

    async def renew(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.renew`."""
        return await drive(renew_op(self.statements, record_id, token, lease=lease), self._driver)

    async def mark_committed(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.mark_committed`."""
        op = mark_committed_op(self.statements, record_id, token, lease=lease)
        return await drive(op, self._driver)

    async def delete(self, record_id: str) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.delete`."""
        return await drive(delete_op(self.statements, record_id), self._driver)

    async def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.complete`."""
        op = complete_op(self.statements, record_id, token, response, ttl=ttl)
        return await drive(op, self._driver)

    async def release(self, record_id: str, token: str) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.release`."""
        return await drive(release_op(self.statements, record_id, token), self._driver)

    async def get(self, record_id: str) -> Record | None:
        """See :meth:`retrysafe.stores.AsyncStore.get`."""
        return await drive(get_op(self.statements, record_id), self._driver)

    async def purge_expired(self) -> int:
        """See :meth:`retrysafe.stores.AsyncStore.purge_expired`; deletes in batches."""
        return await drive(purge_op(self.statements), self._driver)

    async def stats(self) -> StoreStats:
        """Count the records by state (see :class:`~retrysafe.stores.StoreStats`); one query,
        on the server's clock."""
        return StoreStats.from_row(await drive(stats_op(self.statements), self._driver))

    def begin(self) -> AsyncMySQLTransaction:
        """Return a transaction (begun on first use) for transactional mode."""
        return AsyncMySQLTransaction(self)

    async def aclose(self) -> None:
        """Close the idle pooled connections (connections in use close when given back)."""
        await self._driver.aclose()


class AsyncMySQLTransaction:
    """A request's MySQL transaction (transactional mode): a pooled connection in a
    transaction, begun on first use; the fenced completion is written and committed in it.

    A lost connection is not retried here (the transaction died with it): it surfaces as
    :class:`~retrysafe.StoreUnavailableError`, the handler's writes are gone, and the key's
    lease lapses so a retry runs afresh.

    Args:
        store: the store whose database holds both the records and the application's tables.
    """

    def __init__(self, store: AsyncMySQLStore) -> None:
        self._driver = store._driver
        self._statements = store.statements
        self._tx: Any = None
        self._lock = asyncio.Lock()  # two concurrent first calls must share one transaction

    @property
    def begun(self) -> bool:
        """Whether the transaction is open."""
        return self._tx is not None

    @property
    def broken(self) -> bool:
        """Whether the connection died (a terminated backend, a lost socket)."""
        return self._tx is not None and self._driver.broken(self._tx)

    async def connection(self) -> Any:
        """Begin the transaction if needed and return its ``asyncmy.Connection``."""
        if self._tx is None:
            async with self._lock:
                if self._tx is None:
                    self._tx = await self._driver.begin()
        return self._tx.conn

    async def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """Write the completion in the transaction and commit; ``False`` (rolled back) when
        fenced out."""
        await self.connection()
        op = complete_op(self._statements, record_id, token, response, ttl=ttl)
        if not await drive(op, self):
            await self.rollback()
            return False
        await self._driver.commit(self._tx)
        return True

    async def perform(self, query: Query) -> Rows:
        """Send one statement of the completion in the transaction (for :func:`drive`)."""
        return await self._driver.tx_fetch(self._tx, query)

    async def rollback(self) -> None:
        """Undo the handler's writes."""
        if self._tx is not None:
            await self._driver.rollback(self._tx)

    async def close(self) -> None:
        """Roll back anything not committed and give the connection back to the pool."""
        tx, self._tx = self._tx, None
        if tx is not None:
            await self._driver.end(tx)
