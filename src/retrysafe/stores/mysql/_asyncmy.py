"""The asyncmy driver under :class:`~retrysafe.stores.mysql.AsyncMySQLStore` (what is the
driver's own; the store's logic is in the facade and in ``_sql.py``).

The sync twin, ``_pymysql.py`` (PyMySQL, whose API asyncmy follows), is generated from this
file by ``scripts/unasync.py`` (``make lint`` checks that it is up to date): edit this file,
then run the script.

The script's rules hold what differs: the pool's scope (an event loop on the async face; a
process, shared by its threads under a lock, on the sync one) and how a dead idle connection is
told (the transport's state; a zero-timeout poll of the socket).

It keeps a small pool of connections per event loop and process, sends one statement on a
pooled connection (:meth:`AsyncmyDriver.perform`), creates the table, and runs a request's
transaction. Errors leave it as :class:`~retrysafe.StoreError` (``ConnectionLostError`` when an
established connection broke, so the operation may repeat the statement).
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Any, NoReturn

import asyncmy

from ..._core.drive import drive
from ..._core.errors import StoreError, StoreUnavailableError
from .._sql_ops import ConnectionLostError, Query, Rows
from . import _owner
from ._sql import (
    STORE_NAME,
    MySQLOptions,
    RetryableError,
    Statements,
    ensure_schema_op,
    error_kind,
)

__all__ = ["AsyncmyDriver"]

logger = logging.getLogger("retrysafe.stores.mysql")


def _error(exc: BaseException, *, established: bool, what: str) -> StoreError:
    """Translate a driver or socket error (``established``: it came from an open connection,
    so it may be a lost one)."""
    message = f"MySQL {what} failed: {type(exc).__name__}: {exc}"
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
    lost: type[StoreError] = ConnectionLostError if established else StoreUnavailableError
    kind = error_kind(code)
    if kind == "retry":
        return RetryableError(message, store=STORE_NAME)
    if kind == "lost":
        return lost(message, store=STORE_NAME)
    if kind == "unavailable" or isinstance(exc, TimeoutError):
        return StoreUnavailableError(message, store=STORE_NAME)
    if isinstance(exc, OSError | asyncmy.errors.InterfaceError):
        return lost(message, store=STORE_NAME)
    return StoreError(message, store=STORE_NAME)


def _raise(
    exc: BaseException, *, what: str, established: bool = False, tx: _Tx | None = None
) -> NoReturn:
    """Raise what ``exc`` (just caught) means: itself when it is no ``Exception`` (a
    cancellation), else its :class:`~retrysafe.StoreError`. A transaction ``tx`` it happened in
    is marked failed: its connection is discarded, never reused in an unknown state."""
    if tx is not None:
        tx.failed = True
    if not isinstance(exc, Exception):
        raise exc
    raise _error(exc, established=established, what=what) from exc


def _close(conn: Any) -> None:
    try:
        conn.close()
    except Exception as exc:  # already closed, or the server is gone
        logger.debug("closing a MySQL connection: %s", exc)


def _broken(conn: Any) -> bool:
    """Whether ``conn``'s session is gone (asyncmy's transport state)."""
    try:
        return bool(conn._stream_broken) or not conn.connected
    except Exception:
        return True


async def _run(conn: Any, query: Query) -> Rows:
    """One statement: its rows; a write's: one row holding its affected-row count, or none
    when it changed no row (so ``bool(rows)`` is whether it took effect, as on PostgreSQL)."""
    async with conn.cursor() as cur:
        count = await cur.execute(query.statement.sql, query.args)
        if query.statement.returns_rows:
            rows: Rows = await cur.fetchall()
            return rows
        return ((count,),) if count else ()


class _Pool:
    """Connections of one event loop in one process: the idle ones last in, first out."""

    def __init__(self, options: MySQLOptions) -> None:
        self.options = options
        self.loop = asyncio.get_running_loop()
        self.pid = os.getpid()
        self.idle: list[Any] = []
        self.slots = asyncio.Semaphore(options.max_size)
        self.closed = False
        self.kwargs = options.connect_kwargs()

    async def acquire(self, what: str) -> Any:
        try:
            async with asyncio.timeout(self.options.pool_timeout):
                await self.slots.acquire()
        except TimeoutError:
            raise StoreUnavailableError(
                f"MySQL {what} failed: no free connection within {self.options.pool_timeout:g} s",
                store=STORE_NAME,
            ) from None
        try:
            while True:
                try:
                    conn = self.idle.pop()  # atomic under the GIL
                except IndexError:
                    break
                if not _broken(conn):
                    return conn
                _close(conn)
            try:
                return await asyncmy.connect(**self.kwargs)
            except Exception as exc:
                raise _error(exc, established=False, what=what) from exc
        except BaseException:
            self.slots.release()
            raise

    def release(self, conn: Any, *, discard: bool = False) -> None:
        if discard or self.closed or _broken(conn):
            _close(conn)
        else:
            self.idle.append(conn)
        self.slots.release()

    async def aclose(self) -> None:
        self.closed = True
        idle, self.idle = self.idle, []
        for conn in idle:
            try:
                await asyncio.wait_for(conn.ensure_closed(), 1.0)
            except Exception:
                _close(conn)


@dataclass(slots=True)
class _OnConnection:
    """Statements on one connection (the schema's), for :func:`drive`."""

    conn: Any

    async def perform(self, query: Query) -> Rows:
        return await _run(self.conn, query)


@dataclass(slots=True)
class _Tx:
    """A request's transaction: its pool, its connection, and whether it is still open."""

    pool: _Pool
    conn: Any
    open: bool = True
    failed: bool = False  # a statement of ours failed on it: discard it, never reuse


class AsyncmyDriver:
    """asyncmy connections, pooled per event loop and process (opened on first use), for the
    store's ``statements`` (their ``options`` are the store's)."""

    def __init__(self, statements: Statements) -> None:
        self.statements = statements
        self.options: MySQLOptions = statements.options
        self._pool: _Pool | None = None
        self._schema_done = not self.options.auto_create

    async def _current(self) -> _Pool:
        pool = self._pool
        if (
            pool is not None
            and pool.loop is asyncio.get_running_loop()
            and pool.pid == os.getpid()
            and not pool.closed
        ):
            return pool
        # First use, another event loop (asyncio.run twice) or a forked child: a fresh pool.
        # The old one's connections are dropped, not closed: those of a parent belong to its
        # sessions, those of a finished loop cannot be closed from here.
        pool = self._pool = _Pool(self.options)
        if not self._schema_done:
            await self._ensure_schema(pool, only_if_missing=True)
            self._schema_done = True
        return pool

    async def _ensure_schema(self, pool: _Pool, *, only_if_missing: bool) -> None:
        conn = await pool.acquire("schema set-up")
        ok = False
        try:
            op = ensure_schema_op(self.statements, only_if_missing=only_if_missing)
            await drive(op, _OnConnection(conn))
            ok = True
        except StoreError:
            raise
        except Exception as exc:
            raise _error(exc, established=False, what="schema set-up") from exc
        finally:
            pool.release(conn, discard=not ok)

    async def ensure_schema(self) -> None:
        """Create the table and its index if missing (looked up first, so an existing table
        costs a read and raises no "already exists" note)."""
        await self._ensure_schema(await self._current(), only_if_missing=True)

    async def perform(self, query: Query) -> Rows:
        """Send one statement on a pooled connection and return its rows (for :func:`drive`)."""
        pool = await self._current()
        what = query.statement.name
        conn = await pool.acquire(what)
        try:
            rows = await _run(conn, query)
        except BaseException as exc:
            # Failed or cancelled mid-statement: its protocol state is unknown.
            pool.release(conn, discard=True)
            _raise(exc, established=True, what=what)
        pool.release(conn)
        return rows

    # -- owner liveness --------------------------------------------------------------------------

    def owner_held(self) -> bool:
        """Whether this process's owner lock is held."""
        return _owner.held(self.options)

    async def hold_owner_lock(self) -> bool:
        """Take this process's owner lock (see ``_owner.py``); its one connect and statement run
        in a worker thread, once per process."""
        return await asyncio.to_thread(_owner.hold, self.options, self.statements)

    async def aclose(self) -> None:
        """Close the idle connections of this loop's pool."""
        pool, self._pool = self._pool, None
        if pool is not None and pool.pid == os.getpid():
            if pool.loop is asyncio.get_running_loop():
                await pool.aclose()
            else:
                pool.closed = True

    # -- a request's transaction -----------------------------------------------------------------
    # A lost connection is never a ConnectionLostError here: the transaction died with it, so
    # no statement of it may be repeated on another connection.

    async def begin(self) -> _Tx:
        """A pooled connection with a transaction begun (the pool's are in autocommit)."""
        pool = await self._current()
        conn = await pool.acquire("begin")
        try:
            await conn.begin()
        except BaseException as exc:
            pool.release(conn, discard=True)
            _raise(exc, what="begin")
        return _Tx(pool, conn)

    async def tx_fetch(self, tx: _Tx, query: Query) -> Rows:
        """Send one statement in the transaction."""
        try:
            return await _run(tx.conn, query)
        except BaseException as exc:
            _raise(exc, what=query.statement.name, tx=tx)

    async def commit(self, tx: _Tx) -> None:
        """Commit the transaction."""
        tx.open = False
        try:
            await tx.conn.commit()
        except BaseException as exc:
            _raise(exc, what="commit", tx=tx)

    async def rollback(self, tx: _Tx) -> None:
        """Roll the transaction back (nothing when it has ended)."""
        if not tx.open:
            return
        tx.open = False
        if _broken(tx.conn):
            tx.failed = True  # the server rolls back the transaction of a session that ended
            return
        try:
            await tx.conn.rollback()
        except BaseException as exc:
            _raise(exc, what="rollback", tx=tx)

    async def end(self, tx: _Tx) -> None:
        """Roll back anything not committed and give the connection back to the pool, or
        discard it when a statement on it failed (it is never reused in an unknown state)."""
        try:
            await self.rollback(tx)
        except StoreError as exc:
            logger.debug("rollback on close failed: %s", exc)
        tx.pool.release(tx.conn, discard=tx.failed)

    def broken(self, tx: _Tx) -> bool:
        """Whether the transaction's connection died (a killed session, a lost socket)."""
        return _broken(tx.conn)
