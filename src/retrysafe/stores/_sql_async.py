"""The async face of the server SQL stores (PostgreSQL, MySQL/MariaDB): the store's logic, once,
over a dialect (its ``_sql.py``) and its driver (``postgres/_asyncpg.py``, ``mysql/_asyncmy.py``).

The sync twin, ``_sql_sync.py``, is generated from this file by ``scripts/unasync.py``
(``make lint`` checks that it is up to date): edit this file, then run the script.

Each operation is a generator of ``_sql_ops.py`` (or the dialect's own ``reserve_op``) run by
the one action loop, its statements sent through the driver; the driver owns the pool, the
owner lock and the connection of a request's transaction. A dialect's store is a subclass that
names its :class:`~._sql_ops.Dialect` (options, statements, reservation), its driver class and
its transaction class (a subclass of :class:`AsyncSQLTransaction` for its name); no method
wraps another, so a store call costs what it cost when each dialect had its own facade (the
reservation is called as a method of the statements: as cheap to find as a module's function).
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar, Protocol, Self

from .._core.drive import drive
from .._core.records import Record, Reservation
from ._base import StoreStats
from ._sql_ops import (
    Dialect,
    Op,
    Query,
    Rows,
    complete_op,
    delete_op,
    get_op,
    mark_committed_op,
    purge_op,
    release_op,
    renew_op,
    stats_op,
)
from ._url import StoreURL

__all__ = ["AsyncSQLDriver", "AsyncSQLStore", "AsyncSQLTransaction"]


class AsyncSQLDriver(Protocol):
    """What the facade asks of a dialect's driver (the methods :func:`drive` and the
    transaction call; the driver's transaction object is its own)."""

    async def perform(self, query: Query) -> Rows: ...
    def owner_held(self) -> bool: ...
    async def hold_owner_lock(self) -> bool: ...
    async def ensure_schema(self) -> None: ...
    async def aclose(self) -> None: ...
    async def begin(self) -> Any: ...
    async def tx_fetch(self, tx: Any, query: Query) -> Rows: ...
    async def commit(self, tx: Any) -> None: ...
    async def rollback(self, tx: Any) -> None: ...
    async def end(self, tx: Any) -> None: ...
    def broken(self, tx: Any) -> bool: ...


class AsyncSQLStore:
    """The store's methods over a dialect: the base of
    :class:`~retrysafe.stores.postgres.AsyncPostgresStore` and
    :class:`~retrysafe.stores.mysql.AsyncMySQLStore`, which name their ``dialect`` and
    ``driver_class`` and document their URL (the constructor's ``url`` and ``**options``).
    """

    kind = "sql"
    dialect: ClassVar[Dialect]
    driver_class: ClassVar[Any]
    transaction_class: ClassVar[type[AsyncSQLTransaction]]

    def __init__(self, url: str | StoreURL, **options: Any) -> None:
        dialect = self.dialect
        self.options: Any = dialect.options.from_url(url, **options)
        self.statements: Any = dialect.statements(self.options)
        self._driver: AsyncSQLDriver = self.driver_class(self.statements)

    @classmethod
    def from_url(cls, url: str | StoreURL) -> Self:
        """Build from the URL (``postgresql://...?table=...``, ``mysql://...``)."""
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
        op: Op[Reservation] = self.statements.reserve(
            record_id, fingerprint, lease=lease, ttl=ttl, owned=owned
        )
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

    def begin(self) -> AsyncSQLTransaction:
        """Return a transaction (begun on first use) for transactional mode."""
        return self.transaction_class(self)

    async def aclose(self) -> None:
        """Close the pool: idle connections now, those in use when they come back (asyncpg
        waits up to 10 s for them, then terminates them)."""
        await self._driver.aclose()


class AsyncSQLTransaction:
    """A request's transaction (transactional mode): a pooled connection in a transaction,
    begun on first use; the fenced completion is written and committed in it.

    A lost connection is not retried here (the transaction died with it): it surfaces as
    :class:`~retrysafe.StoreUnavailableError`, the handler's writes are gone, and the key's
    lease lapses so a retry runs afresh.

    Args:
        store: the store whose database holds both the records and the application's tables.
    """

    def __init__(self, store: AsyncSQLStore) -> None:
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
        """Whether the connection died (a terminated backend, a killed session, a lost
        socket)."""
        return self._tx is not None and self._driver.broken(self._tx)

    async def connection(self) -> Any:
        """Begin the transaction if needed and return its connection (the driver's own:
        ``asyncpg.Connection``, ``asyncmy.Connection``)."""
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
