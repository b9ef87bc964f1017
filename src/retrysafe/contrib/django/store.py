"""The Django ORM store: records in a table of a Django database (``"django"`` or
``"django://<alias>"``), created by ``manage.py migrate``.

Every operation is one SQL statement on Django's own connection of the calling thread, in
autocommit (reserve is an ``INSERT ... ON CONFLICT DO UPDATE ... WHERE ... RETURNING``, atomic on
SQLite and PostgreSQL alike; on MySQL and MariaDB, which have neither, an ``INSERT ... ON
DUPLICATE KEY UPDATE`` whose conflict branch runs under the row's lock on its latest version,
then a read of the row's token: it won when the token is its own). In transactional mode
:meth:`DjangoStore.begin` gives a transaction that wraps the view in
``transaction.atomic(using=alias)`` on the request's connection and writes the completion record
inside it, so the view's ORM writes and the stored response commit together, or neither does.

Times come from the app host's clock (as with the SQLite store): hosts sharing a PostgreSQL
database through this store must keep their clocks in sync (NTP); the ``postgresql://`` URL store
uses the database server's clock instead.

The store declares itself (:data:`BACKEND`) to the store registry through the
``retrysafe.stores`` entry point ``django``, so ``"django"`` and ``"django://<alias>"`` resolve
like any store URL, and this module (with Django) is imported only when one is used.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    InterfaceError,
    OperationalError,
    connections,
    transaction,
)

from ..._core.errors import ConfigurationError, StoreError, StoreUnavailableError
from ..._core.records import Record, Reservation, new_token
from ..._core.transaction import ForwardedState
from ...stores._registry import Backend, parse_store_url
from ...stores._sql import record_from_row, settled_from_row
from ...stores._url import StoreURL

__all__ = [
    "BACKEND",
    "AsyncDjangoStore",
    "AsyncDjangoTransaction",
    "DjangoStore",
    "DjangoTransaction",
    "current_route",
    "parse_django_url",
]

T = TypeVar("T")

TABLE = "retrysafe_record"
_PURGE_BATCH = 1000

#: The route label (``"POST /orders/<int:pk>"``) the middleware sets around a reservation, so
#: the admin can show where a record came from (the store protocol carries no route).
current_route: contextvars.ContextVar[str] = contextvars.ContextVar("retrysafe_route", default="")


def parse_django_url(url: str | StoreURL) -> str:
    """The database alias of ``django`` / ``django://`` / ``django://<alias>``.

    Raises:
        ConfigurationError: not a django store URL, or the alias is not in ``DATABASES``.
    """
    parsed = parse_store_url(url) if isinstance(url, str) else url
    if parsed.scheme != "django":
        raise ConfigurationError(f"not a django store URL: {parsed.url!r} (use 'django://<alias>')")
    alias: str = parsed.location or parsed.path.strip("/") or DEFAULT_DB_ALIAS
    if alias not in connections.settings:
        known = ", ".join(sorted(connections.settings)) or "none"
        raise ConfigurationError(
            f"store {parsed.url!r}: no database {alias!r} in settings.DATABASES (known: {known})"
        )
    return alias


#: MySQL's reserve. The conflict branch takes the row over when its retention ended or its lease
#: lapsed (or it is this call's own); every assignment repeats that condition, token first, so
#: the result does not depend on whether the server applies assignments left to right or all at
#: once (MariaDB's SIMULTANEOUS_ASSIGNMENT). Column -> (new value, its parameter or None).
_MYSQL_TAKES = (
    "({t}.token = %s OR {t}.expires_at <= %s OR ({t}.state = 0 AND {t}.lease_expires_at <= %s))"
)
_MYSQL_TAKES_PARAMS = ("token", "now", "now")
_MYSQL_SETS = {
    "token": ("%s", "token"),
    "fingerprint": ("%s", "fp"),
    "response": ("NULL", None),
    "state": ("0", None),
    "lease_expires_at": ("%s", "lease_at"),
    "expires_at": ("%s", "expires_at"),
    "created_at": ("%s", "now"),
    "route": ("%s", "route"),
}
_MYSQL_RESERVE = (
    "INSERT INTO {t} (id, fingerprint, state, token, lease_expires_at, expires_at, created_at, "
    "route, response) VALUES (%s, %s, 0, %s, %s, %s, %s, %s, NULL) ON DUPLICATE KEY UPDATE "
    + ", ".join(
        f"{c} = IF({_MYSQL_TAKES}, {new}, {{t}}.{c})" for c, (new, _) in _MYSQL_SETS.items()
    )
)
_MYSQL_RESERVE_PARAMS = (
    *("id", "fp", "token", "lease_at", "expires_at", "now", "route"),
    *(
        p
        for _, name in _MYSQL_SETS.values()
        for p in (*_MYSQL_TAKES_PARAMS, *([name] if name else []))
    ),
)


def _store_error(operation: str, exc: Exception) -> StoreError:
    if isinstance(exc, OperationalError | InterfaceError):
        return StoreUnavailableError(f"Django store {operation} failed: {exc}", store="django")
    return StoreError(f"Django store {operation} failed: {exc}", store="django")


class DjangoStore:
    """Keeps records in the ``retrysafe_record`` table of a Django database.

    Args:
        alias: the database alias (``settings.DATABASES`` key).
        clock: returns the current time in seconds (injectable for tests).
    """

    #: The label of each record (its admin shows it), set by the front around a reservation.
    record_label = current_route

    kind = "django"

    def __init__(self, alias: str = DEFAULT_DB_ALIAS, *, clock: Callable[[], float] = time.time):
        self.alias = alias
        self._clock = clock
        self._sql: dict[str, str] | None = None

    @classmethod
    def from_url(cls, url: str | StoreURL) -> DjangoStore:
        """Build from ``django`` or ``django://<alias>``."""
        return cls(parse_django_url(url))

    def as_async(self) -> AsyncDjangoStore:
        """This store's async face (ASGI): each call in a worker thread."""
        return AsyncDjangoStore(self)

    @property
    def vendor(self) -> str:
        """The database vendor (``"sqlite"``, ``"postgresql"``, ``"mysql"``)."""
        vendor: str = connections[self.alias].vendor
        return vendor

    def _statements(self) -> dict[str, str]:
        if self._sql is None:
            ops = connections[self.alias].ops
            t = ops.quote_name(TABLE)
            self._sql = {
                "reserve": _MYSQL_RESERVE.format(t=t)
                if self.vendor == "mysql"
                else (
                    f"INSERT INTO {t} (id, fingerprint, state, token, lease_expires_at, "
                    "expires_at, created_at, route, response) "
                    "VALUES (%s, %s, 0, %s, %s, %s, %s, %s, NULL) "
                    "ON CONFLICT (id) DO UPDATE SET fingerprint = excluded.fingerprint, "
                    "state = 0, token = excluded.token, "
                    "lease_expires_at = excluded.lease_expires_at, "
                    "expires_at = excluded.expires_at, created_at = excluded.created_at, "
                    "route = excluded.route, response = NULL "
                    f"WHERE {t}.expires_at <= %s OR ({t}.state = 0 AND {t}.lease_expires_at <= %s) "
                    "RETURNING token"
                ),
                "get": (
                    f"SELECT fingerprint, state, lease_expires_at, response FROM {t} "
                    "WHERE id = %s AND expires_at > %s"
                ),
                "renew": (
                    f"UPDATE {t} SET lease_expires_at = %s "
                    "WHERE id = %s AND token = %s AND state IN (0, 2)"
                ),
                "mark_committed": (
                    f"UPDATE {t} SET state = 2, lease_expires_at = %s "
                    "WHERE id = %s AND token = %s AND state IN (0, 2)"
                ),
                "complete": (
                    f"UPDATE {t} SET state = 1, response = %s, expires_at = %s, token = NULL "
                    "WHERE id = %s AND token = %s AND state IN (0, 2)"
                ),
                "release": f"DELETE FROM {t} WHERE id = %s AND token = %s AND state IN (0, 2)",
                "delete": f"DELETE FROM {t} WHERE id = %s",
                "purge": (
                    # MySQL refuses LIMIT in an IN subquery, and a subquery on the table the
                    # DELETE writes; it has DELETE ... LIMIT instead.
                    f"DELETE FROM {t} WHERE expires_at <= %s LIMIT {_PURGE_BATCH}"
                    if self.vendor == "mysql"
                    else f"DELETE FROM {t} WHERE id IN "
                    f"(SELECT id FROM {t} WHERE expires_at <= %s LIMIT {_PURGE_BATCH})"
                ),
                "holder": f"SELECT token, state FROM {t} WHERE id = %s",
            }
        return self._sql

    def _run(self, name: str, params: list[Any]) -> tuple[int, list[tuple[Any, ...]]]:
        """Run one statement; returns (rowcount, rows)."""
        conn = connections[self.alias]
        try:
            with conn.cursor() as cursor:
                cursor.execute(self._statements()[name], params)
                rows = cursor.fetchall() if cursor.description else []
                return cursor.rowcount, rows
        except DatabaseError as exc:
            if not conn.in_atomic_block:
                # A dead connection is reopened by the next statement, not reused forever
                # (threads beside the request, e.g. lease renewal, never hit request_finished).
                conn.close_if_unusable_or_obsolete()
            raise _store_error(name, exc) from exc

    _record = staticmethod(record_from_row)

    def _settled(self, record_id: str) -> Reservation | None:
        """The record of ``record_id`` when it decides the reservation without a write (a
        read, so never waiting for SQLite's writer); ``None`` when only the write decides."""
        now = self._clock()
        _, rows = self._run("get", [record_id, now])
        record = settled_from_row(rows[0] if rows else None, now)
        return None if record is None else Reservation(record=record)

    def reserve(self, record_id: str, fingerprint: str, *, lease: float, ttl: float) -> Reservation:
        """See :meth:`retrysafe.stores.Store.reserve`.

        On SQLite (one writer at a time) it reads first, like the SQLite URL store: a key whose
        record decides (a duplicate in progress, a replay, another request with the key) is
        answered without queueing behind another request's transaction; only a key that needs
        the write (new, or a lapsed lease to take over) waits for the lock, up to the
        database's ``timeout``.
        """
        sqlite = self.vendor == "sqlite"
        if sqlite:
            settled = self._settled(record_id)
            if settled is not None:
                return settled
        while True:
            now = self._clock()
            token = new_token()
            params = [record_id, fingerprint, token, now + lease, now + ttl, now]
            try:
                if self.vendor == "mysql":
                    won = self._reserve_mysql(params)
                else:
                    won = bool(self._run("reserve", [*params, current_route.get(), now, now])[1])
            except StoreUnavailableError:
                # The lock stayed taken for the whole timeout: a record written meanwhile
                # still decides from a read.
                settled = self._settled(record_id) if sqlite else None
                if settled is None:
                    raise
                return settled
            if won:
                return Reservation(token=token)
            _, rows = self._run("get", [record_id, now])
            if rows:
                return Reservation(record=self._record(rows[0], now))
            # Released or purged between the two statements: try again.

    def _reserve_mysql(self, params: list[Any]) -> bool:
        """MySQL's reserve: the upsert, then whether the row holds this call's token. (Django's
        MySQL connections count found rows, not changed ones, so the upsert's row count cannot
        tell a won key from a live one.)"""
        record_id, fingerprint, token, lease_at, expires_at, now = params
        values = {
            "id": record_id,
            "fp": fingerprint,
            "token": token,
            "lease_at": lease_at,
            "expires_at": expires_at,
            "now": now,
            "route": current_route.get(),
        }
        self._run("reserve", [values[name] for name in _MYSQL_RESERVE_PARAMS])
        _, rows = self._run("holder", [record_id])
        return bool(rows) and rows[0][0] == token and rows[0][1] == 0

    def renew(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.Store.renew`."""
        return self._run("renew", [self._clock() + lease, record_id, token])[0] == 1

    def mark_committed(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.Store.mark_committed`."""
        return self._run("mark_committed", [self._clock() + lease, record_id, token])[0] == 1

    def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """See :meth:`retrysafe.stores.Store.complete` (inside an open atomic block, it commits
        with that block)."""
        params = [response, self._clock() + ttl, record_id, token]
        return self._run("complete", params)[0] == 1

    def release(self, record_id: str, token: str) -> bool:
        """See :meth:`retrysafe.stores.Store.release`."""
        return self._run("release", [record_id, token])[0] == 1

    def delete(self, record_id: str) -> bool:
        """See :meth:`retrysafe.stores.Store.delete`."""
        return self._run("delete", [record_id])[0] == 1

    def get(self, record_id: str) -> Record | None:
        """See :meth:`retrysafe.stores.Store.get`."""
        now = self._clock()
        _, rows = self._run("get", [record_id, now])
        return self._record(rows[0], now) if rows else None

    def purge_expired(self) -> int:
        """See :meth:`retrysafe.stores.Store.purge_expired`; deletes in batches."""
        total = 0
        now = self._clock()
        while True:
            deleted = self._run("purge", [now])[0]
            total += deleted
            if deleted < _PURGE_BATCH:
                return total

    def begin(self) -> DjangoTransaction:
        """Return the transaction of one request (transactional mode)."""
        return DjangoTransaction(self)

    def close(self) -> None:
        """Nothing to do: Django owns its connections."""


class DjangoTransaction:
    """One request's ``transaction.atomic(using=alias)`` block on Django's own connection of the
    request's thread. The shell begins it (:meth:`connection`) before the view runs, so every
    ORM write of the view (and, with ``ATOMIC_REQUESTS``, its inner atomic block, a savepoint)
    is part of it; :meth:`complete` writes the record and leaves the block, committing both.

    Args:
        store: the store whose database holds both the records and the application's tables.
    """

    #: The view or function writes through the ORM, never through :meth:`connection`: the block
    #: is entered before it runs.
    begins_eagerly = True

    def __init__(self, store: DjangoStore) -> None:
        self._store = store
        self._atomic: Any = None
        self._conn: Any = None  # the wrapper of the thread that entered the block
        self._changes = -1  # SQLite: the connection's total_changes when the block began

    @property
    def begun(self) -> bool:
        """Whether the atomic block is open."""
        return self._atomic is not None

    @property
    def broken(self) -> bool:
        """Whether the connection closed (died) inside the block (read from any thread)."""
        return bool(self._atomic is not None and self._conn.closed_in_transaction)

    @property
    def holds_write_lock(self) -> bool:
        """Whether the block holds SQLite's single write lock (read from any thread): it began
        ``IMMEDIATE``, or the view has written in it. No other connection can then write the
        request's record until the block ends, so its lease needs no renewal meanwhile (and a
        renewal, a write, would queue behind it). Always ``False`` on other databases."""
        conn = self._conn
        if self._atomic is None or conn is None or conn.vendor != "sqlite":
            return False
        raw = conn.connection
        if raw is None or not raw.in_transaction:
            return False
        mode = str(conn.settings_dict.get("OPTIONS", {}).get("transaction_mode") or "")
        return mode.upper() in ("IMMEDIATE", "EXCLUSIVE") or raw.total_changes != self._changes

    def connection(self) -> Any:
        """Enter the atomic block if needed; returns Django's connection wrapper."""
        if self._atomic is None:
            atomic = transaction.atomic(using=self._store.alias)
            try:
                atomic.__enter__()
            except DatabaseError as exc:
                raise _store_error("begin", exc) from exc
            self._atomic = atomic
            self._conn = connections[self._store.alias]
            raw = self._conn.connection
            if self._conn.vendor == "sqlite" and raw is not None:
                self._changes = raw.total_changes
        return self._conn

    def _leave(self, *, commit: bool) -> None:
        atomic, self._atomic = self._atomic, None
        if atomic is None:
            return
        if not commit:
            transaction.set_rollback(True, using=self._store.alias)
        try:
            atomic.__exit__(None, None, None)
        except DatabaseError as exc:
            raise _store_error("commit" if commit else "rollback", exc) from exc

    def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """Write the completion inside the block and commit; ``False`` (rolled back) when
        fenced out."""
        self.connection()
        try:
            done = self._store.complete(record_id, token, response, ttl=ttl)
        except StoreError:
            self._leave(commit=False)
            raise
        self._leave(commit=done)
        return done

    def rollback(self) -> None:
        """Undo the view's writes (leave the block, rolled back)."""
        self._leave(commit=False)

    def close(self) -> None:
        """Roll back anything not committed."""
        self._leave(commit=False)


def _hop(function: Callable[..., T], *, sensitive: bool) -> Callable[..., Any]:
    return sync_to_async(function, thread_sensitive=sensitive)


class AsyncDjangoStore:
    """The async face of :class:`DjangoStore` (ASGI): each operation runs in a worker thread,
    with its own connection in autocommit (``thread_sensitive=False``), so a renewal or a
    reservation never lands inside another request's atomic block.

    Args:
        store: the synchronous store.
    """

    #: The label of each record (its admin shows it), set by the front around a reservation.
    record_label = current_route

    kind = "django"

    def __init__(self, store: DjangoStore) -> None:
        self.sync = store

    @classmethod
    def from_url(cls, url: str | StoreURL) -> AsyncDjangoStore:
        """Build from ``django`` or ``django://<alias>``."""
        return cls(DjangoStore.from_url(url))

    async def reserve(
        self, record_id: str, fingerprint: str, *, lease: float, ttl: float
    ) -> Reservation:
        """See :meth:`retrysafe.stores.AsyncStore.reserve`."""
        route = current_route.get()

        def run() -> Reservation:
            current_route.set(route)
            return self.sync.reserve(record_id, fingerprint, lease=lease, ttl=ttl)

        result: Reservation = await _hop(run, sensitive=False)()
        return result

    async def renew(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.renew`."""
        return bool(await _hop(self.sync.renew, sensitive=False)(record_id, token, lease=lease))

    async def mark_committed(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.mark_committed`."""
        hop = _hop(self.sync.mark_committed, sensitive=False)
        return bool(await hop(record_id, token, lease=lease))

    async def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.complete`."""
        hop = _hop(self.sync.complete, sensitive=False)
        return bool(await hop(record_id, token, response, ttl=ttl))

    async def release(self, record_id: str, token: str) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.release`."""
        return bool(await _hop(self.sync.release, sensitive=False)(record_id, token))

    async def delete(self, record_id: str) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.delete`."""
        return bool(await _hop(self.sync.delete, sensitive=False)(record_id))

    async def get(self, record_id: str) -> Record | None:
        """See :meth:`retrysafe.stores.AsyncStore.get`."""
        record: Record | None = await _hop(self.sync.get, sensitive=False)(record_id)
        return record

    async def purge_expired(self) -> int:
        """See :meth:`retrysafe.stores.AsyncStore.purge_expired`."""
        return int(await _hop(self.sync.purge_expired, sensitive=False)())

    def begin(self) -> AsyncDjangoTransaction:
        """Return the transaction of one request (transactional mode)."""
        return AsyncDjangoTransaction(DjangoTransaction(self.sync))

    async def aclose(self) -> None:
        """Nothing to do: Django owns its connections."""


class AsyncDjangoTransaction(ForwardedState):
    """The async face of :class:`DjangoTransaction`: every step runs in the request's
    thread-sensitive thread, the one where Django runs the request's sync code and ORM calls
    (``sync_to_async(thread_sensitive=True)``), so the atomic block and the view's writes share
    one connection.

    Args:
        tx: the synchronous transaction.
    """

    begins_eagerly = True  # see DjangoTransaction.begins_eagerly

    def __init__(self, tx: DjangoTransaction) -> None:
        self.sync = self.wrapped = tx

    async def connection(self) -> Any:
        """See :meth:`DjangoTransaction.connection`."""
        return await _hop(self.sync.connection, sensitive=True)()

    async def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """See :meth:`DjangoTransaction.complete`."""
        hop = _hop(self.sync.complete, sensitive=True)
        return bool(await hop(record_id, token, response, ttl=ttl))

    async def rollback(self) -> None:
        """See :meth:`DjangoTransaction.rollback`."""
        await _hop(self.sync.rollback, sensitive=True)()

    async def close(self) -> None:
        """See :meth:`DjangoTransaction.close`."""
        if self.sync.begun:
            await _hop(self.sync.close, sensitive=True)()


#: The Django ORM store's declaration, found through the ``retrysafe.stores`` entry point.
BACKEND = Backend(
    name="django",
    schemes=("django",),
    store=DjangoStore,
    async_store=AsyncDjangoStore,
    extra="django",
)
