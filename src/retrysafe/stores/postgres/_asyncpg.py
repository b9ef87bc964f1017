"""The asyncpg driver under :class:`~retrysafe.stores.postgres.AsyncPostgresStore` (hand-written:
what is asyncpg's own; the store's logic is in the facade and in ``_sql.py``).

It sends one statement on a pooled connection (:meth:`AsyncpgDriver.perform`), creates the table,
holds this process's owner lock on a connection of its own, and runs a request's transaction.
Errors leave it as :class:`~retrysafe.StoreError` (``ConnectionLostError`` when an established
connection broke, so the operation may repeat the statement).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import asyncpg

from ..._core.drive import drive
from ..._core.errors import StoreError, StoreUnavailableError
from ..._core.records import instance_id
from .._fork import INHERITED, reset_after_fork
from .._loops import close_with_loop
from .._sql_ops import ConnectionLostError, Query, Rows
from . import _sql
from ._sql import STORE_NAME, owner_lock_query

__all__ = ["AsyncpgDriver"]

logger = logging.getLogger("retrysafe.stores.postgres")


async def _keep_session(connection: Any) -> None:
    """The pool's ``reset`` callback: nothing to reset (see the package docstring)."""


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
        if _sql.is_unavailable_sqlstate(sqlstate):
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


@dataclass(slots=True)
class _OnConnection:
    """Statements on one connection (the schema's transaction), for :func:`drive`."""

    conn: Any

    async def perform(self, query: Query) -> Rows:
        rows: Rows = await self.conn.fetch(query.statement.sql, *query.args)
        return rows


@dataclass(slots=True)
class _Tx:
    """A request's transaction: its pooled connection and asyncpg's transaction object."""

    pool: Any
    conn: Any
    tx: Any
    failed: bool = False  # a statement of ours failed on the connection: discard it


@contextlib.contextmanager
def _failing(tx: _Tx, what: str) -> Iterator[None]:
    """A statement of the transaction: if it fails (or is cancelled), its connection is
    discarded at the end; a failure is a store error, never a lost connection to retry on."""
    try:
        yield
    except BaseException as exc:
        tx.failed = True
        if not isinstance(exc, Exception):
            raise
        raise _asyncpg_error(exc, established=False, what=what) from exc


class AsyncpgDriver:
    """An asyncpg pool per event loop (opened on first use in that loop, closed when the loop
    shuts down; see :mod:`retrysafe.stores._loops`) and the owner lock. In a forked child it
    opens its own (see :mod:`retrysafe.stores._fork`).

    Args:
        statements: the store's statements (and, as their ``options``, its options).
    """

    def __init__(self, statements: _sql.Statements) -> None:
        self.statements = statements
        self.options: _sql.PostgresOptions = statements.options
        # The pool of the loop that used the store last (the hot path's one check), and every
        # loop's: a pool and the generator that closes it when its loop ends.
        self._pool: Any = None
        self._pool_loop: asyncio.AbstractEventLoop | None = None
        self._pools: dict[asyncio.AbstractEventLoop, tuple[Any, Any]] = {}
        self._locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}
        # Owner liveness: the dedicated connection holding this process's owner lock.
        self._owner_conn: Any = None
        self._owner_instance = ""
        self._owner_lock: asyncio.Lock | None = None
        self._owner_loop: asyncio.AbstractEventLoop | None = None
        self._owner_retry_at = 0.0
        self._owner_guard: Any = None
        self._inherited: list[Any] = []
        reset_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: the parent's pools and owner connection are never used (nor
        closed: their loops run in the parent)."""
        INHERITED.append((self._pools, self._owner_conn, self._owner_guard))
        self._pool = self._pool_loop = self._owner_conn = self._owner_lock = None
        self._owner_guard = None
        self._owner_loop = None
        self._pools, self._locks = {}, {}

    def _loop_pool(self) -> Any:
        """The running loop's pool, or ``None``."""
        loop = asyncio.get_running_loop()
        if self._pool_loop is loop:
            return self._pool
        found = self._pools.get(loop)
        if found is None:
            return None
        self._pool, self._pool_loop = found[0], loop
        return found[0]

    async def _open(self) -> Any:
        loop = asyncio.get_running_loop()
        lock = self._locks.get(loop)
        if lock is None:
            for old in [old for old in self._locks if old.is_closed()]:
                del self._locks[old]  # a loop closed without shutting down its generators
                self._pools.pop(old, None)
            lock = self._locks[loop] = asyncio.Lock()
        async with lock:
            pool = self._loop_pool()
            if pool is not None:
                return pool
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
            guard = await close_with_loop(functools.partial(self._close_pool, loop, pool))
            self._pools[loop] = (pool, guard)
            self._pool, self._pool_loop = pool, loop
            return pool

    async def _close_pool(self, loop: asyncio.AbstractEventLoop, pool: Any) -> None:
        """Close one loop's pool (waits up to 10 s for connections in use, then terminates
        them), in that loop."""
        if self._pools.get(loop, (None,))[0] is pool:
            del self._pools[loop]
        self._locks.pop(loop, None)
        if self._pool is pool:
            self._pool = self._pool_loop = None
        try:
            await asyncio.wait_for(pool.close(), 10.0)
        except Exception:
            pool.terminate()

    async def _ensure_schema(self, pool: Any, *, only_if_missing: bool) -> None:
        try:
            async with pool.acquire(timeout=self.options.pool_timeout) as conn:
                op = _sql.ensure_schema_op(self.statements, only_if_missing=only_if_missing)
                async with conn.transaction():
                    await drive(op, _OnConnection(conn))
        except StoreError:
            raise
        except Exception as exc:
            raise _asyncpg_error(exc, established=False, what="schema set-up") from exc

    async def ensure_schema(self) -> None:
        """Create the table and its index if missing, in one transaction."""
        pool = self._loop_pool() or await self._open()
        await self._ensure_schema(pool, only_if_missing=False)

    async def perform(self, query: Query) -> Rows:
        """Send one statement on a pooled connection and return its rows (for :func:`drive`)."""
        pool = self._pool if self._pool_loop is asyncio.get_running_loop() else None
        if pool is None:
            pool = self._loop_pool() or await self._open()
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

    # -- owner liveness --------------------------------------------------------------------------

    def owner_held(self) -> bool:
        """Whether this process's owner lock is held, on a connection of this event loop."""
        conn = self._owner_conn
        return (
            conn is not None
            and self._owner_instance == instance_id()
            and self._owner_loop is asyncio.get_running_loop()
            and not conn.is_closed()
        )

    async def hold_owner_lock(self) -> bool:
        """Open the dedicated connection and take this process's owner lock (once per process;
        again after the connection was lost, at most every few seconds). ``False``: not held,
        so this process's tokens do not name it (its keys wait for the lease, as before)."""
        loop = asyncio.get_running_loop()
        if self._owner_lock is None or self._owner_loop is not loop:
            # A connection (and a lock) belongs to one event loop; a store used from another
            # loop (asyncio.run twice) takes the owner lock again there.
            self._owner_lock = asyncio.Lock()
        async with self._owner_lock:
            instance = instance_id()
            if self.owner_held():
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
                query = owner_lock_query(self.statements, instance)
                await conn.fetch(query.statement.sql, *query.args, timeout=o.connect_timeout)
            except Exception as exc:
                logger.warning("owner liveness off for now (lock failed): %s", exc)
                conn.terminate()
                return False
            self._owner_conn = conn
            self._owner_guard = await close_with_loop(functools.partial(self._end_owner, conn))
            return True

    async def _end_owner(self, conn: Any) -> None:
        """End the owner lock's session of a loop that ends (or of the store that closes)."""
        if self._owner_conn is conn:
            self._owner_conn = None
        if not conn.is_closed():
            conn.terminate()

    async def aclose(self) -> None:
        """Close this loop's pool (waits up to 10 s for connections in use, then terminates
        them) and end the owner lock's session. Pools of other loops still running close when
        their loop ends."""
        guard, self._owner_guard = self._owner_guard, None
        if guard is not None and self._owner_loop is asyncio.get_running_loop():
            await guard.aclose()  # runs _end_owner
        found = self._pools.get(asyncio.get_running_loop())
        if found is not None:
            await found[1].aclose()  # runs _close_pool

    # -- a request's transaction -----------------------------------------------------------------
    # A lost connection is never a ConnectionLostError here: the transaction died with it, so
    # no statement of it may be repeated on another connection.

    async def begin(self) -> _Tx:
        """A pooled connection with its transaction started."""
        pool = self._loop_pool() or await self._open()
        for _ in range(self.options.max_size + 1):  # as in perform
            try:
                async with asyncio.timeout(self.options.pool_timeout):
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
            return _Tx(pool, conn, tx)
        raise StoreUnavailableError(
            "PostgreSQL begin failed: no live connection in the pool", store=STORE_NAME
        )

    async def tx_fetch(self, tx: _Tx, query: Query) -> Rows:
        """Send one statement in the transaction."""
        with _failing(tx, query.statement.name):
            rows: Rows = await tx.conn.fetch(query.statement.sql, *query.args)
        return rows

    async def commit(self, tx: _Tx) -> None:
        """Commit the transaction."""
        started, tx.tx = tx.tx, None
        with _failing(tx, "commit"):
            await started.commit()

    async def rollback(self, tx: _Tx) -> None:
        """Roll the transaction back (nothing when it has ended)."""
        started, tx.tx = tx.tx, None
        if started is None:
            return
        try:
            await started.rollback()
        except BaseException as exc:
            # E.g. the handler's own statement was cancelled and is still in progress.
            tx.failed = True
            if not isinstance(exc, Exception):
                raise
            if _never_sent(exc) or self.broken(tx):
                # The connection is dead or stuck mid-statement: it is discarded, and the
                # server rolls back the transaction of a connection that goes away.
                _discard(tx.conn)
                return
            raise _asyncpg_error(exc, established=False, what="rollback") from exc

    async def end(self, tx: _Tx) -> None:
        """Roll back anything not committed and give the connection back to the pool, or
        discard it when a statement on it failed (it is never reused in an unknown state)."""
        if tx.tx is not None:
            try:
                await self.rollback(tx)
            except StoreError as exc:
                logger.debug("rollback on close failed: %s", exc)
        if tx.failed:
            _discard(tx.conn)
        await _give_back(tx.pool, tx.conn)

    def broken(self, tx: _Tx) -> bool:
        """Whether the transaction's connection died (a terminated backend, a lost socket)."""
        try:
            return bool(tx.conn.is_closed())
        except Exception:
            return True
