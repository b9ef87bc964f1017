# Generated from src/retrysafe/stores/_sql_async.py by scripts/unasync.py: do not edit.
"""The sync face of the server SQL stores (PostgreSQL, MySQL/MariaDB): the store's logic, once,
over a dialect (its ``_sql.py``) and its driver (``postgres/_psycopg.py``, ``mysql/_pymysql.py``).

This file is generated from ``_sql_async.py`` by ``scripts/unasync.py``
(``make lint`` checks that it is up to date): edit that file, then run the script.

Each operation is a generator of ``_sql_ops.py`` (or the dialect's own ``reserve_op``) run by
the one action loop, its statements sent through the driver; the driver owns the pool, the
owner lock and the connection of a request's transaction. A dialect's store is a subclass that
names its :class:`~._sql_ops.Dialect` (options, statements, reservation), its driver class and
its transaction class (a subclass of :class:`SQLTransaction` for its name); no method
wraps another, so a store call costs what it cost when each dialect had its own facade (the
reservation is called as a method of the statements: as cheap to find as a module's function).
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar, Protocol, Self

from .._core.drive_sync import drive
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

__all__ = ["SQLDriver", "SQLStore", "SQLTransaction"]


class SQLDriver(Protocol):
    """What the facade asks of a dialect's driver (the methods :func:`drive` and the
    transaction call; the driver's transaction object is its own)."""

    def perform(self, query: Query) -> Rows: ...
    def owner_held(self) -> bool: ...
    def hold_owner_lock(self) -> bool: ...
    def ensure_schema(self) -> None: ...
    def close(self) -> None: ...
    def begin(self) -> Any: ...
    def tx_fetch(self, tx: Any, query: Query) -> Rows: ...
    def commit(self, tx: Any) -> None: ...
    def rollback(self, tx: Any) -> None: ...
    def end(self, tx: Any) -> None: ...
    def broken(self, tx: Any) -> bool: ...


class SQLStore:
    """The store's methods over a dialect: the base of
    :class:`~retrysafe.stores.postgres.PostgresStore` and
    :class:`~retrysafe.stores.mysql.MySQLStore`, which name their ``dialect`` and
    ``driver_class`` and document their URL (the constructor's ``url`` and ``**options``).
    """

    kind = "sql"
    dialect: ClassVar[Dialect]
    driver_class: ClassVar[Any]
    transaction_class: ClassVar[type[SQLTransaction]]

    def __init__(self, url: str | StoreURL, **options: Any) -> None:
        dialect = self.dialect
        self.options: Any = dialect.options.from_url(url, **options)
        self.statements: Any = dialect.statements(self.options)
        self._driver: SQLDriver = self.driver_class(self.statements)

    @classmethod
    def from_url(cls, url: str | StoreURL) -> Self:
        """Build from the URL (``postgresql://...?table=...``, ``mysql://...``)."""
        return cls(url)

    def ensure_schema(self) -> None:
        """Create the table and its expiry index if missing (idempotent).

        ``retrysafe schema apply --store URL`` calls this.

        Raises:
            StoreError: the server refused (e.g. no CREATE right on the schema).
            StoreUnavailableError: the server cannot be reached.
        """
        self._driver.ensure_schema()

    def reserve(self, record_id: str, fingerprint: str, *, lease: float, ttl: float) -> Reservation:
        """See :meth:`retrysafe.stores.Store.reserve`."""
        driver = self._driver
        owned = driver.owner_held() or driver.hold_owner_lock()
        op: Op[Reservation] = self.statements.reserve(
            record_id, fingerprint, lease=lease, ttl=ttl, owned=owned
        )
        return drive(op, driver)

    def renew(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.Store.renew`."""
        return drive(renew_op(self.statements, record_id, token, lease=lease), self._driver)

    def mark_committed(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.Store.mark_committed`."""
        op = mark_committed_op(self.statements, record_id, token, lease=lease)
        return drive(op, self._driver)

    def delete(self, record_id: str) -> bool:
        """See :meth:`retrysafe.stores.Store.delete`."""
        return drive(delete_op(self.statements, record_id), self._driver)

    def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """See :meth:`retrysafe.stores.Store.complete`."""
        op = complete_op(self.statements, record_id, token, response, ttl=ttl)
        return drive(op, self._driver)

    def release(self, record_id: str, token: str) -> bool:
        """See :meth:`retrysafe.stores.Store.release`."""
        return drive(release_op(self.statements, record_id, token), self._driver)

    def get(self, record_id: str) -> Record | None:
        """See :meth:`retrysafe.stores.Store.get`."""
        return drive(get_op(self.statements, record_id), self._driver)

    def purge_expired(self) -> int:
        """See :meth:`retrysafe.stores.Store.purge_expired`; deletes in batches."""
        return drive(purge_op(self.statements), self._driver)

    def stats(self) -> StoreStats:
        """Count the records by state (see :class:`~retrysafe.stores.StoreStats`); one query,
        on the server's clock."""
        return StoreStats.from_row(drive(stats_op(self.statements), self._driver))

    def begin(self) -> SQLTransaction:
        """Return a transaction (begun on first use) for transactional mode."""
        return self.transaction_class(self)

    def close(self) -> None:
        """Close the pool: idle connections now, those in use when they come back."""
        self._driver.close()


class SQLTransaction:
    """A request's transaction (transactional mode): a pooled connection in a transaction,
    begun on first use; the fenced completion is written and committed in it.

    A lost connection is not retried here (the transaction died with it): it surfaces as
    :class:`~retrysafe.StoreUnavailableError`, the handler's writes are gone, and the key's
    lease lapses so a retry runs afresh.

    Args:
        store: the store whose database holds both the records and the application's tables.
    """

    def __init__(self, store: SQLStore) -> None:
        self._driver = store._driver
        self._statements = store.statements
        self._tx: Any = None
        self._lock = threading.Lock()  # two concurrent first calls must share one transaction

    @property
    def begun(self) -> bool:
        """Whether the transaction is open."""
        return self._tx is not None

    @property
    def broken(self) -> bool:
        """Whether the connection died (a terminated backend, a killed session, a lost
        socket)."""
        return self._tx is not None and self._driver.broken(self._tx)

    def connection(self) -> Any:
        """Begin the transaction if needed and return its connection (the driver's own:
        ``psycopg.Connection``, ``pymysql.Connection``)."""
        if self._tx is None:
            with self._lock:
                if self._tx is None:
                    self._tx = self._driver.begin()
        return self._tx.conn

    def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """Write the completion in the transaction and commit; ``False`` (rolled back) when
        fenced out."""
        self.connection()
        op = complete_op(self._statements, record_id, token, response, ttl=ttl)
        if not drive(op, self):
            self.rollback()
            return False
        self._driver.commit(self._tx)
        return True

    def perform(self, query: Query) -> Rows:
        """Send one statement of the completion in the transaction (for :func:`drive`)."""
        return self._driver.tx_fetch(self._tx, query)

    def rollback(self) -> None:
        """Undo the handler's writes."""
        if self._tx is not None:
            self._driver.rollback(self._tx)

    def close(self) -> None:
        """Roll back anything not committed and give the connection back to the pool."""
        tx, self._tx = self._tx, None
        if tx is not None:
            self._driver.end(tx)
