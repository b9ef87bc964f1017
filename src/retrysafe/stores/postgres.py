"""PostgreSQL store: one service across many app instances and hosts.

``AsyncPostgresStore`` runs on asyncpg, ``PostgresStore`` (WSGI, Django, the CLI) on psycopg 3
with ``psycopg_pool``. Both run the same statements (``sql/postgres.sql``) and the same operation
code (:mod:`retrysafe.stores._postgres_sql`); this module holds only the two driver loops.

Choices, and why:

- **Drivers.** Client CPU per operation, measured with ``time.process_time`` on this project's
  2-core machine (server on the same machine, interleaved rounds of 400 calls, medians; new key
  per ``reserve``): pooled ``reserve`` asyncpg 156-161 us, psycopg 3 async 140-147 us (asyncpg
  with its default reset query: 200-208 us); pooled ``get`` 72 vs 68 us; on one bare
  connection ``get`` costs 41.5 us with asyncpg and 52.6 us with psycopg. So asyncpg's protocol
  is the cheaper one and its pool eats the difference (about 30 us per acquire/release, psycopg's
  about 17 us). asyncpg stays the async driver: pooled they tie within the noise, asyncpg notices
  connections the server closed while idle by itself (psycopg finds out on use), and the cheaper
  protocol is there to take with a leaner pool. psycopg is the sync driver (asyncpg has no sync
  API).
- **One placeholder style.** The ``.sql`` file uses ``:name``; it is rewritten once, at load, to
  PostgreSQL's native ``$1, $2...``, which asyncpg takes as is and psycopg takes through its
  ``RawCursor`` (no ``%s`` parsing, so no ``%`` escaping either). Both drivers send the
  byte-identical statement text.
- **Prepared statements.** asyncpg prepares and caches every statement per connection; psycopg
  is asked to prepare the per-request statements on first use (``prepare=True``).
- **No reset query.** asyncpg's pool runs ``SELECT pg_advisory_unlock_all(); CLOSE ALL;
  UNLISTEN *; RESET ALL`` on every release: one more round trip per operation (19% of the
  client CPU in a prototype). The store gives the pool a ``reset`` callback that does nothing;
  asyncpg still rolls back a connection left inside a transaction before calling it. That is
  safe because the store never leaves session state behind: no session ``SET`` (its only
  setting, ``synchronous_commit``, is transaction-local), no ``LISTEN``, no cursors, no session
  advisory locks, every statement its own transaction. psycopg_pool has no reset query by
  default.
- **Owner liveness.** Each store holds, per process, one dedicated connection outside the pool
  (the pooled ones still carry no session lock)
  with a session-level shared advisory lock named by the process's instance id (opened with the
  first reservation, again after ``fork``). Its tokens name that instance only while the lock is
  held. A reservation that meets another process's in-progress record runs one more statement,
  ``take_over``: an exclusive transaction-level try-lock on the owner's lock succeeds only when
  no session holds it, i.e. the owner's connection is gone (the process died: its socket closed,
  the server ended the session at once), and then replaces the record, fenced on its token.
- **The server's clock.** Leases and retention are computed and compared with
  ``clock_timestamp()`` on the server (``timestamptz`` columns, ``make_interval``), so app hosts
  with skewed clocks still agree on who holds a key.
- **Errors.** Refused or lost connections, pool timeouts and server shutdowns become
  :class:`~retrysafe.StoreUnavailableError` (the middleware answers ``503`` + ``Retry-After``);
  other server errors :class:`~retrysafe.StoreError`. A broken connection is dropped by the pool,
  never reused; the next operation opens a fresh one, so the store recovers by itself when the
  server is back. An operation whose connection broke mid-statement is repeated once on a fresh
  connection when that is safe (see the operations' docstrings).
- **Pool hygiene (asyncpg).** A connection on which a statement failed, or whose statement was
  cancelled, is terminated before it goes back, so the pool replaces it and never hands out a
  connection that is mid-operation or dead. And a connection whose backend was terminated while
  it sat idle can be handed out before asyncpg has read the socket's end: its protocol then
  refuses the statement before sending anything ("cannot switch to state ...; another operation
  is in progress"). Nothing reached the server, so the statement goes to another connection
  (:func:`_never_sent`), silently, instead of failing the request.

URL options (``postgresql://user@host/db?table=idem.records&max_size=20``): see
:class:`~retrysafe.stores._postgres_sql.PostgresOptions`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import select
import threading
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any, TypeVar

from .._core.errors import StoreError, StoreUnavailableError
from .._core.records import Record, Reservation, instance_id
from ._postgres_sql import (
    OWNER_LOCK_CLASS,
    STORE_NAME,
    ConnectionLostError,
    PostgresOptions,
    Query,
    Rows,
    Statements,
    complete_op,
    delete_op,
    ensure_schema_op,
    get_op,
    is_unavailable_sqlstate,
    mark_committed_op,
    owner_lock_key,
    purge_op,
    release_op,
    renew_op,
    reserve_op,
)

__all__ = [
    "AsyncPostgresStore",
    "AsyncPostgresTransaction",
    "PostgresStore",
    "PostgresTransaction",
    "drive_async",
    "drive_sync",
]

logger = logging.getLogger("retrysafe.stores.postgres")

T = TypeVar("T")
_Op = Generator[Query, Rows, T]


async def drive_async(op: _Op[T], fetch: Callable[[Query], Awaitable[Rows]]) -> T:
    """Run an operation generator, sending its queries through ``fetch``.

    Args:
        op: the operation (``reserve_op(...)``...).
        fetch: sends one query, returns its rows; raises :class:`ConnectionLostError` when an
            established connection broke (the operation may then repeat the query).

    Returns:
        The operation's result.
    """
    try:
        query = next(op)
        while True:
            try:
                rows = await fetch(query)
            except ConnectionLostError as exc:
                query = op.throw(exc)
                continue
            query = op.send(rows)
    except StopIteration as stop:
        result: T = stop.value
        return result


def drive_sync(op: _Op[T], fetch: Callable[[Query], Rows]) -> T:
    """The synchronous twin of :func:`drive_async`."""
    try:
        query = next(op)
        while True:
            try:
                rows = fetch(query)
            except ConnectionLostError as exc:
                query = op.throw(exc)
                continue
            query = op.send(rows)
    except StopIteration as stop:
        result: T = stop.value
        return result


# -- asyncpg -------------------------------------------------------------------------------------


async def _keep_session(connection: Any) -> None:
    """The pool's ``reset`` callback: nothing to reset (see the module docstring)."""


def _asyncpg_error(
    exc: BaseException, *, established: bool, what: str, closed: bool = False
) -> StoreError:
    """Translate an asyncpg/socket error.

    Args:
        exc: the error.
        established: the error came from a connection that was open (so it may be "lost").
        what: the operation, for the message.
        closed: that connection is closed now. Whatever the error says, it is then a lost
            connection: a backend terminated in the middle of a statement can surface as an
            ``InternalClientError`` about the protocol state, seen in tests.
    """
    import asyncpg

    message = f"PostgreSQL {what} failed: {type(exc).__name__}: {exc}"
    sqlstate = getattr(exc, "sqlstate", None)
    lost: type[StoreError] = ConnectionLostError if established else StoreUnavailableError
    if _never_sent(exc):
        # asyncpg's text ("another operation is in progress") would send a reader after a
        # concurrency bug; what happened is a connection the server had closed.
        message = f"PostgreSQL {what} failed: the connection was closed by the server"
        return lost(message, store=STORE_NAME)
    if closed:
        return lost(message, store=STORE_NAME)
    if isinstance(exc, asyncpg.PostgresError):
        if is_unavailable_sqlstate(sqlstate):
            return lost(message, store=STORE_NAME)
        return StoreError(message, store=STORE_NAME)
    if isinstance(exc, TimeoutError):
        return StoreUnavailableError(message, store=STORE_NAME)
    if isinstance(exc, OSError | asyncpg.InterfaceError) and (
        not isinstance(exc, asyncpg.InterfaceError) or "closed" in str(exc)
    ):
        return lost(message, store=STORE_NAME)
    return StoreError(message, store=STORE_NAME)


def _never_sent(exc: BaseException) -> bool:
    """Whether asyncpg refused to start a statement on a connection without sending anything.

    These errors come from the client's protocol state checks, before a byte is written: a
    connection already closed, or one whose protocol is not idle (an idle connection that read
    its backend's termination notice but not yet the end of the socket). Any statement may
    then run on another connection, since the server never saw it.
    """
    import asyncpg

    text = str(exc)
    if isinstance(exc, asyncpg.InternalClientError):
        return text.startswith("cannot switch to state")
    if isinstance(exc, asyncpg.InterfaceError) and not isinstance(
        exc, asyncpg.PostgresConnectionError
    ):
        return text.startswith("cannot perform operation") or text == "connection is closed"
    return False


def _discard(conn: Any) -> None:
    """Terminate a pooled connection that failed or was cancelled mid-statement; the pool takes
    its holder back and opens a fresh connection on a later acquire."""
    try:
        conn.terminate()
    except Exception as exc:  # already detached from the pool (it closed it)
        logger.debug("discarding a PostgreSQL connection: %s", exc)


async def _give_back(pool: Any, conn: Any) -> None:
    try:
        await pool.release(conn)
    except Exception as exc:
        # The pool has already terminated this connection; the next acquire opens a fresh
        # one. The statement's own outcome is what the caller needs.
        logger.debug("dropping a broken PostgreSQL connection: %s", exc)


class AsyncPostgresStore:
    """Keeps records in a PostgreSQL table, through an asyncpg connection pool.

    The pool is opened on first use, in the running event loop. With ``auto_create`` (default)
    the table is created then if it is missing.

    Args:
        url: ``postgresql://user:password@host:port/db?option=value``; see
            :class:`~retrysafe.stores._postgres_sql.PostgresOptions` for the options.
        **options: the same options as keywords (they win over the URL's).

    Raises:
        ConfigurationError: an option has a bad value.
    """

    def __init__(self, url: str, **options: Any) -> None:
        self.options = PostgresOptions.from_url(url, **options)
        self.statements = Statements(self.options)
        self._pool: Any = None
        self._lock: asyncio.Lock | None = None
        # Owner liveness: the dedicated connection holding this process's owner lock.
        self._owner_conn: Any = None
        self._owner_instance = ""
        self._owner_lock: asyncio.Lock | None = None
        self._owner_loop: asyncio.AbstractEventLoop | None = None
        self._owner_retry_at = 0.0
        self._inherited: list[Any] = []

    @classmethod
    def from_url(cls, url: str) -> AsyncPostgresStore:
        """Build from ``postgresql://...?table=...``."""
        return cls(url)

    async def _open(self) -> Any:
        import asyncpg

        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._pool is not None:
                return self._pool
            o = self.options
            try:
                pool = await asyncpg.create_pool(
                    o.dsn,
                    min_size=o.min_size,
                    max_size=o.max_size,
                    timeout=o.connect_timeout,
                    server_settings={"application_name": o.application_name},
                    reset=_keep_session,
                    max_inactive_connection_lifetime=o.max_idle,
                )
            except Exception as exc:
                raise _asyncpg_error(exc, established=False, what="connect") from exc
            if o.auto_create:
                try:
                    await self._ensure_schema(pool, only_if_missing=True)
                except BaseException:
                    pool.terminate()
                    raise
            self._pool = pool
            return pool

    async def _ensure_schema(self, pool: Any, *, only_if_missing: bool) -> None:
        try:
            async with pool.acquire(timeout=self.options.pool_timeout) as conn:

                async def fetch(query: Query) -> Rows:
                    rows: Rows = await conn.fetch(query.statement.sql, *query.args)
                    return rows

                op = ensure_schema_op(self.statements, only_if_missing=only_if_missing)
                async with conn.transaction():
                    await drive_async(op, fetch)
        except StoreError:
            raise
        except Exception as exc:
            raise _asyncpg_error(exc, established=False, what="schema set-up") from exc

    async def ensure_schema(self) -> None:
        """Create the table and its expiry index if missing (idempotent).

        Raises:
            StoreError: the server refused (e.g. no CREATE right on the schema).
            StoreUnavailableError: the server cannot be reached.
        """
        pool = self._pool or await self._open()
        await self._ensure_schema(pool, only_if_missing=False)

    async def _fetch(self, query: Query) -> Rows:
        pool = self._pool or await self._open()
        what = query.statement.name
        # Every idle connection may have been terminated at once (a server restart, an
        # operator's pg_terminate_backend): one more try than the pool holds reaches a new one.
        for _ in range(self.options.max_size + 1):
            try:
                # asyncio.timeout, not acquire(timeout=...): on Python 3.11 the latter wraps the
                # acquire in asyncio.wait_for, a new task per call (about 40 us of CPU measured).
                async with asyncio.timeout(self.options.pool_timeout):
                    conn = await pool.acquire()
            except Exception as exc:
                raise _asyncpg_error(exc, established=False, what=what) from exc
            try:
                rows: Rows = await conn.fetch(query.statement.sql, *query.args)
            except BaseException as exc:
                try:
                    closed = conn.is_closed()
                except Exception:
                    # The pool already took the connection back: it does so when it closes.
                    closed = True
                # Failed or cancelled mid-statement: its protocol state is unknown, so it
                # never goes back to the pool as it is.
                _discard(conn)
                await _give_back(pool, conn)
                if not isinstance(exc, Exception):
                    raise
                if _never_sent(exc):
                    logger.debug("PostgreSQL %s: skipping a dead pooled connection: %s", what, exc)
                    continue
                raise _asyncpg_error(exc, established=True, what=what, closed=closed) from exc
            await _give_back(pool, conn)
            return rows
        raise StoreUnavailableError(
            f"PostgreSQL {what} failed: no live connection in the pool", store=STORE_NAME
        )

    async def reserve(
        self, record_id: str, fingerprint: str, *, lease: float, ttl: float
    ) -> Reservation:
        """See :meth:`retrysafe.stores.AsyncStore.reserve`."""
        owned = self._owner_held() or await self._hold_owner_lock()
        op = reserve_op(self.statements, record_id, fingerprint, lease=lease, ttl=ttl, owned=owned)
        return await drive_async(op, self._fetch)

    def _owner_held(self) -> bool:
        conn = self._owner_conn
        return (
            conn is not None
            and self._owner_instance == instance_id()
            and self._owner_loop is asyncio.get_running_loop()
            and not conn.is_closed()
        )

    async def _hold_owner_lock(self) -> bool:
        """Open the dedicated connection and take this process's owner lock (once per process;
        again after the connection was lost, at most every few seconds). ``False``: not held,
        so this process's tokens do not name it (its keys wait for the lease, as before)."""
        import asyncpg

        loop = asyncio.get_running_loop()
        if self._owner_lock is None or self._owner_loop is not loop:
            # A connection (and a lock) belongs to one event loop; a store used from another
            # loop (asyncio.run twice) takes the owner lock again there.
            self._owner_lock = asyncio.Lock()
        async with self._owner_lock:
            instance = instance_id()
            if self._owner_held():
                return True
            if (
                time.monotonic() < self._owner_retry_at
                and self._owner_instance == instance
                and self._owner_loop is loop
            ):
                return False
            conn, self._owner_conn = self._owner_conn, None
            if conn is not None:
                if self._owner_instance == instance:
                    try:
                        conn.terminate()  # closed already, or of another (maybe closed) loop
                    except Exception as exc:
                        logger.debug("dropping the old owner connection: %s", exc)
                else:
                    # From before fork: ending it would end the parent's session and lock.
                    self._inherited.append(conn)
            self._owner_loop = loop
            self._owner_instance = instance
            self._owner_retry_at = time.monotonic() + 5.0
            o = self.options
            try:
                conn = await asyncpg.connect(
                    o.dsn,
                    timeout=o.connect_timeout,
                    server_settings={"application_name": f"{o.application_name}-owner"},
                )
            except Exception as exc:
                logger.warning("owner liveness off for now (connect failed): %s", exc)
                return False
            try:
                query = self.statements.query(
                    "owner_lock", owner_class=OWNER_LOCK_CLASS, owner_key=owner_lock_key(instance)
                )
                await conn.fetch(query.statement.sql, *query.args, timeout=o.connect_timeout)
            except Exception as exc:
                logger.warning("owner liveness off for now (lock failed): %s", exc)
                conn.terminate()
                return False
            self._owner_conn = conn
            return True

    async def renew(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.renew`."""
        return await drive_async(
            renew_op(self.statements, record_id, token, lease=lease), self._fetch
        )

    async def mark_committed(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.mark_committed`."""
        op = mark_committed_op(self.statements, record_id, token, lease=lease)
        return await drive_async(op, self._fetch)

    async def delete(self, record_id: str) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.delete`."""
        return await drive_async(delete_op(self.statements, record_id), self._fetch)

    async def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.complete`."""
        op = complete_op(self.statements, record_id, token, response, ttl=ttl)
        return await drive_async(op, self._fetch)

    async def release(self, record_id: str, token: str) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.release`."""
        return await drive_async(release_op(self.statements, record_id, token), self._fetch)

    async def get(self, record_id: str) -> Record | None:
        """See :meth:`retrysafe.stores.AsyncStore.get`."""
        return await drive_async(get_op(self.statements, record_id), self._fetch)

    async def purge_expired(self) -> int:
        """See :meth:`retrysafe.stores.AsyncStore.purge_expired`; deletes in batches."""
        return await drive_async(purge_op(self.statements), self._fetch)

    def begin(self) -> AsyncPostgresTransaction:
        """Return a transaction (begun on first use) for transactional mode."""
        return AsyncPostgresTransaction(self)

    async def aclose(self) -> None:
        """Close the pool (waits up to 10 s for connections in use, then terminates them)."""
        owner, self._owner_conn = self._owner_conn, None
        if owner is not None and self._owner_instance == instance_id():
            try:
                owner.terminate()
            except Exception as exc:  # its event loop may be gone
                logger.debug("dropping the owner connection: %s", exc)
        pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            await asyncio.wait_for(pool.close(), 10.0)
        except Exception:
            pool.terminate()


class AsyncPostgresTransaction:
    """A request's PostgreSQL transaction (transactional mode): a pooled connection in a
    transaction, begun on first use; the fenced completion is written and committed in it.

    A lost connection is not retried here (the transaction died with it): it surfaces as
    :class:`~retrysafe.StoreUnavailableError`, the handler's writes are gone, and the key's
    lease lapses so a retry runs afresh.

    Args:
        store: the store whose database holds both the records and the application's tables.
    """

    def __init__(self, store: AsyncPostgresStore) -> None:
        self._store = store
        self._pool: Any = None
        self._conn: Any = None
        self._tx: Any = None
        self._failed = False  # a statement of ours failed on the connection: discard it
        self._lock = asyncio.Lock()  # two concurrent first calls must share one transaction

    @property
    def begun(self) -> bool:
        """Whether the transaction is open."""
        return self._conn is not None

    @property
    def broken(self) -> bool:
        """Whether the connection died (a terminated backend, a lost socket)."""
        try:
            return self._conn is not None and bool(self._conn.is_closed())
        except Exception:
            return True

    async def connection(self) -> Any:
        """Begin the transaction if needed and return its ``asyncpg.Connection``."""
        if self._conn is not None:
            return self._conn
        async with self._lock:
            if self._conn is None:
                await self._begin()
            return self._conn

    async def _begin(self) -> None:
        store = self._store
        pool = store._pool or await store._open()
        for _ in range(store.options.max_size + 1):  # as AsyncPostgresStore._fetch
            try:
                async with asyncio.timeout(store.options.pool_timeout):
                    conn = await pool.acquire()
            except Exception as exc:
                raise _asyncpg_error(exc, established=False, what="begin") from exc
            try:
                tx = conn.transaction()
                await tx.start()
            except BaseException as exc:
                _discard(conn)
                await _give_back(pool, conn)
                if isinstance(exc, Exception) and _never_sent(exc):
                    continue
                if not isinstance(exc, Exception):
                    raise
                raise _asyncpg_error(exc, established=False, what="begin") from exc
            self._pool, self._conn, self._tx = pool, conn, tx
            return
        raise StoreUnavailableError(
            "PostgreSQL begin failed: no live connection in the pool", store=STORE_NAME
        )

    async def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """Write the completion in the transaction and commit; ``False`` (rolled back) when
        fenced out."""
        conn = await self.connection()

        async def fetch(query: Query) -> Rows:
            try:
                rows: Rows = await conn.fetch(query.statement.sql, *query.args)
            except BaseException as exc:
                self._failed = True
                if not isinstance(exc, Exception):
                    raise
                raise _asyncpg_error(exc, established=False, what="complete") from exc
            return rows

        op = complete_op(self._store.statements, record_id, token, response, ttl=ttl)
        if not await drive_async(op, fetch):
            await self.rollback()
            return False
        tx, self._tx = self._tx, None
        try:
            await tx.commit()
        except BaseException as exc:
            self._failed = True
            if not isinstance(exc, Exception):
                raise
            raise _asyncpg_error(exc, established=False, what="commit") from exc
        return True

    async def rollback(self) -> None:
        """Undo the handler's writes."""
        tx, self._tx = self._tx, None
        if tx is None:
            return
        try:
            await tx.rollback()
        except BaseException as exc:
            # E.g. the handler's own statement was cancelled and is still in progress.
            self._failed = True
            if not isinstance(exc, Exception):
                raise
            if _never_sent(exc) or self.broken:
                # The connection is dead or stuck mid-statement: it is discarded, and the
                # server rolls back the transaction of a connection that goes away.
                _discard(self._conn)
                return
            raise _asyncpg_error(exc, established=False, what="rollback") from exc

    async def close(self) -> None:
        """Roll back anything not committed and give the connection back to the pool, or
        discard it when a statement on it failed (it is never reused in an unknown state)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._tx is not None:
            try:
                await self.rollback()
            except StoreError as exc:
                logger.debug("rollback on close failed: %s", exc)
        if self._failed:
            _discard(conn)
        await _give_back(self._pool, conn)


# -- psycopg ------------------------------------------------------------------------------------


def _psycopg_error(exc: BaseException, *, connection: Any = None, what: str) -> StoreError:
    """Translate a psycopg / psycopg_pool error.

    Args:
        exc: the error.
        connection: the connection the statement ran on (``None``: failed to get one).
        what: the operation, for the message.
    """
    import psycopg

    message = f"PostgreSQL {what} failed: {type(exc).__name__}: {exc}"
    if connection is not None and (
        connection.broken
        or connection.closed
        or is_unavailable_sqlstate(getattr(exc, "sqlstate", None))
    ):
        return ConnectionLostError(message, store=STORE_NAME)
    if isinstance(exc, psycopg.OperationalError | OSError | TimeoutError):
        return StoreUnavailableError(message, store=STORE_NAME)
    return StoreError(message, store=STORE_NAME)


class PostgresStore:
    """Keeps records in a PostgreSQL table, through a psycopg 3 connection pool (thread-safe).

    The pool is opened on first use. With ``auto_create`` (default) the table is created then
    if it is missing. While the server is down, an operation fails after at most
    ``pool_timeout`` seconds (the pool keeps trying to reconnect in the background).

    Args:
        url: ``postgresql://user:password@host:port/db?option=value``; see
            :class:`~retrysafe.stores._postgres_sql.PostgresOptions` for the options.
        **options: the same options as keywords (they win over the URL's).

    Raises:
        ConfigurationError: an option has a bad value.
    """

    def __init__(self, url: str, **options: Any) -> None:
        self.options = PostgresOptions.from_url(url, **options)
        self.statements = Statements(self.options)
        self._pool: Any = None
        self._lock = threading.Lock()
        # Owner liveness: the dedicated connection holding this process's owner lock.
        self._owner_conn: Any = None
        self._owner_instance = ""
        self._owner_lock = threading.Lock()
        self._owner_retry_at = 0.0
        # A connection inherited over fork is kept, never closed: closing it would end the
        # parent's session, and with it the parent's owner lock.
        self._inherited: list[Any] = []

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        """Build from ``postgresql://...?table=...``."""
        return cls(url)

    def _connect_kwargs(self) -> dict[str, Any]:
        import psycopg

        return {
            "autocommit": True,
            # $n placeholders, as in the .sql file; no client-side query rewriting.
            "cursor_factory": psycopg.RawCursor,
            # libpq takes whole seconds (and treats values below 2 as 2).
            "connect_timeout": max(2, math.ceil(self.options.connect_timeout)),
            "application_name": self.options.application_name,
        }

    def _open(self) -> Any:
        import psycopg
        from psycopg_pool import ConnectionPool

        with self._lock:
            if self._pool is not None:
                return self._pool
            o = self.options
            # One direct connection first: a refused port fails at once here, where the pool
            # would keep retrying in the background until its timeout.
            try:
                with psycopg.connect(o.dsn, **self._connect_kwargs()) as conn:
                    if o.auto_create:
                        self._ensure_schema_on(conn, only_if_missing=True)
            except StoreError:
                raise
            except (psycopg.Error, OSError) as exc:
                raise _psycopg_error(exc, what="connect") from exc
            pool: ConnectionPool[Any] = ConnectionPool(
                o.dsn,
                kwargs=self._connect_kwargs(),
                min_size=o.min_size,
                max_size=o.max_size,
                timeout=o.pool_timeout,
                max_idle=o.max_idle or 600.0,
                name=f"retrysafe-{o.table}",
                open=False,
            )
            try:
                pool.open(wait=o.min_size > 0, timeout=o.pool_timeout)
            except psycopg.Error as exc:
                pool.close()
                raise _psycopg_error(exc, what="connect") from exc
            self._pool = pool
            return pool

    def _ensure_schema_on(self, conn: Any, *, only_if_missing: bool) -> None:
        import psycopg

        try:
            with conn.transaction():

                def fetch(query: Query) -> Rows:
                    cur = conn.execute(query.statement.sql, query.args)
                    return cur.fetchall() if cur.description else []

                drive_sync(
                    ensure_schema_op(self.statements, only_if_missing=only_if_missing), fetch
                )
        except psycopg.Error as exc:
            raise _psycopg_error(exc, what="schema set-up") from exc

    def ensure_schema(self) -> None:
        """Create the table and its expiry index if missing (idempotent).

        ``retrysafe schema apply --store URL`` calls this.

        Raises:
            StoreError: the server refused (e.g. no CREATE right on the schema).
            StoreUnavailableError: the server cannot be reached.
        """
        pool = self._pool or self._open()
        try:
            with pool.connection(timeout=self.options.pool_timeout) as conn:
                self._ensure_schema_on(conn, only_if_missing=False)
        except StoreError:
            raise
        except Exception as exc:
            raise _psycopg_error(exc, what="schema set-up") from exc

    def _fetch(self, query: Query) -> Rows:
        pool = self._pool or self._open()
        what = query.statement.name
        try:
            conn = pool.getconn(timeout=self.options.pool_timeout)
        except Exception as exc:
            raise _psycopg_error(exc, what=what) from exc
        try:
            cur = conn.execute(query.statement.sql, query.args, prepare=True)
            rows: Rows = cur.fetchall()
        except Exception as exc:
            error = _psycopg_error(exc, connection=conn, what=what)
            error.__cause__ = exc
        else:
            return rows
        finally:
            # The pool checks the connection's state and discards it if broken.
            pool.putconn(conn)
        if isinstance(error, ConnectionLostError):
            # One dead connection usually means all idle ones are (server restart, terminated
            # backends). psycopg only notices on use, so test the idle ones now: the retry then
            # gets a live connection instead of the next dead one.
            pool.check()
        raise error

    def reserve(self, record_id: str, fingerprint: str, *, lease: float, ttl: float) -> Reservation:
        """See :meth:`retrysafe.stores.Store.reserve`."""
        op = reserve_op(
            self.statements,
            record_id,
            fingerprint,
            lease=lease,
            ttl=ttl,
            owned=self._hold_owner_lock(),
        )
        return drive_sync(op, self._fetch)

    def _owner_alive(self) -> bool:
        conn = self._owner_conn
        if conn is None or self._owner_instance != instance_id() or conn.closed or conn.broken:
            return False
        # psycopg notices a closed session only on use. An idle connection has nothing to read
        # unless the server ended it (a notice, then EOF): one zero-timeout poll tells.
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
        return not readable

    def _hold_owner_lock(self) -> bool:
        """The sync twin of :meth:`AsyncPostgresStore._hold_owner_lock`."""
        if self._owner_alive():
            return True
        import psycopg

        with self._owner_lock:
            if self._owner_alive():
                return True
            instance = instance_id()
            if time.monotonic() < self._owner_retry_at and self._owner_instance == instance:
                return False
            conn, self._owner_conn = self._owner_conn, None
            if conn is not None:
                if self._owner_instance == instance:
                    conn.close()
                else:
                    self._inherited.append(conn)
            self._owner_instance = instance
            self._owner_retry_at = time.monotonic() + 5.0
            o = self.options
            kwargs = self._connect_kwargs()
            kwargs["application_name"] = f"{o.application_name}-owner"
            try:
                conn = psycopg.connect(o.dsn, **kwargs)
            except (psycopg.Error, OSError) as exc:
                logger.warning("owner liveness off for now (connect failed): %s", exc)
                return False
            try:
                query = self.statements.query(
                    "owner_lock", owner_class=OWNER_LOCK_CLASS, owner_key=owner_lock_key(instance)
                )
                conn.execute(query.statement.sql, query.args).fetchall()
            except (psycopg.Error, OSError) as exc:
                logger.warning("owner liveness off for now (lock failed): %s", exc)
                conn.close()
                return False
            self._owner_conn = conn
            return True

    def renew(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.Store.renew`."""
        return drive_sync(renew_op(self.statements, record_id, token, lease=lease), self._fetch)

    def mark_committed(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.Store.mark_committed`."""
        op = mark_committed_op(self.statements, record_id, token, lease=lease)
        return drive_sync(op, self._fetch)

    def delete(self, record_id: str) -> bool:
        """See :meth:`retrysafe.stores.Store.delete`."""
        return drive_sync(delete_op(self.statements, record_id), self._fetch)

    def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """See :meth:`retrysafe.stores.Store.complete`."""
        op = complete_op(self.statements, record_id, token, response, ttl=ttl)
        return drive_sync(op, self._fetch)

    def release(self, record_id: str, token: str) -> bool:
        """See :meth:`retrysafe.stores.Store.release`."""
        return drive_sync(release_op(self.statements, record_id, token), self._fetch)

    def get(self, record_id: str) -> Record | None:
        """See :meth:`retrysafe.stores.Store.get`."""
        return drive_sync(get_op(self.statements, record_id), self._fetch)

    def purge_expired(self) -> int:
        """See :meth:`retrysafe.stores.Store.purge_expired`; deletes in batches."""
        return drive_sync(purge_op(self.statements), self._fetch)

    def begin(self) -> PostgresTransaction:
        """Return a transaction (begun on first use) for transactional mode."""
        return PostgresTransaction(self)

    def close(self) -> None:
        """Close the pool."""
        owner, self._owner_conn = self._owner_conn, None
        if owner is not None and self._owner_instance == instance_id():
            owner.close()
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


class PostgresTransaction:
    """The sync twin of :class:`AsyncPostgresTransaction` (WSGI): a pooled psycopg connection
    with a transaction begun on first use; the fenced completion is written and committed in it.

    Args:
        store: the store whose database holds both the records and the application's tables.
    """

    def __init__(self, store: PostgresStore) -> None:
        self._store = store
        self._pool: Any = None
        self._conn: Any = None
        self._open = False
        self._lock = threading.Lock()  # two concurrent first calls must share one transaction

    @property
    def begun(self) -> bool:
        """Whether the transaction is open."""
        return self._conn is not None

    @property
    def broken(self) -> bool:
        """Whether the connection died (a terminated backend, a lost socket)."""
        conn = self._conn
        return conn is not None and bool(conn.broken or conn.closed)

    def connection(self) -> Any:
        """Begin the transaction if needed and return its ``psycopg.Connection``."""
        with self._lock:
            if self._conn is None:
                store = self._store
                pool = store._pool or store._open()
                try:
                    conn = pool.getconn(timeout=store.options.pool_timeout)
                except Exception as exc:
                    raise _psycopg_error(exc, what="begin") from exc
                try:
                    conn.execute("BEGIN")  # the pool's connections are in autocommit mode
                except Exception as exc:
                    pool.putconn(conn)
                    raise _psycopg_error(exc, what="begin") from exc
                self._pool, self._conn, self._open = pool, conn, True
            return self._conn

    def _execute(self, sql: str, args: Sequence[Any] = (), *, what: str) -> Rows:
        try:
            cur = self._conn.execute(sql, args)
            return cur.fetchall() if cur.description else []
        except Exception as exc:
            # Never a ConnectionLostError: the transaction died with its connection, so the
            # operation must not be repeated on another one.
            raise _psycopg_error(exc, what=what) from exc

    def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """Write the completion in the transaction and commit; ``False`` (rolled back) when
        fenced out."""
        self.connection()

        def fetch(query: Query) -> Rows:
            return self._execute(query.statement.sql, query.args, what="complete")

        op = complete_op(self._store.statements, record_id, token, response, ttl=ttl)
        if not drive_sync(op, fetch):
            self.rollback()
            return False
        self._open = False
        self._execute("COMMIT", what="commit")
        return True

    def rollback(self) -> None:
        """Undo the handler's writes."""
        if self._conn is not None and self._open:
            self._open = False
            self._execute("ROLLBACK", what="rollback")

    def close(self) -> None:
        """Roll back anything not committed and give the connection back to the pool."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._open:
            self._open = False
            try:
                conn.execute("ROLLBACK")
            except Exception as exc:
                logger.debug("rollback on close failed: %s", exc)
        self._pool.putconn(conn)
