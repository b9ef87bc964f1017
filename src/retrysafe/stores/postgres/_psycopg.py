"""The psycopg 3 driver under :class:`~retrysafe.stores.postgres.PostgresStore` (hand-written:
what is psycopg's own; the store's logic is in the facade and in ``_sql.py``).

The same four jobs as ``_asyncpg.py`` with a thread-safe ``psycopg_pool``: one statement on a
pooled connection, the table, the owner lock on a connection of its own, a request's
transaction. Errors leave it as :class:`~retrysafe.StoreError`.
"""

from __future__ import annotations

import logging
import math
import select
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from ..._core.drive_sync import drive
from ..._core.errors import StoreError, StoreUnavailableError
from ..._core.records import instance_id
from .._fork import INHERITED, neuter_socket, reset_after_fork
from .._sql_ops import ConnectionLostError, Query, Rows
from ._sql import (
    STORE_NAME,
    PostgresOptions,
    Statements,
    ensure_schema_op,
    is_unavailable_sqlstate,
    owner_lock_query,
)

__all__ = ["PsycopgDriver"]

logger = logging.getLogger("retrysafe.stores.postgres")


def _psycopg_error(exc: BaseException, *, connection: Any = None, what: str) -> StoreError:
    """Translate a psycopg / psycopg_pool error.

    Args:
        exc: the error.
        connection: the connection the statement ran on (``None``: failed to get one).
        what: the operation, for the message.
    """
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


@dataclass(slots=True)
class _OnConnection:
    """Statements on one connection (the schema's transaction), for :func:`drive`."""

    conn: Any

    def perform(self, query: Query) -> Rows:
        cur = psycopg.RawCursor(self.conn).execute(query.statement.sql, query.args)
        rows: Rows = cur.fetchall() if cur.description else []
        return rows


@dataclass(slots=True)
class _Tx:
    """A request's transaction: its pooled connection, and whether it is still open."""

    pool: Any
    conn: Any
    open: bool = True


class PsycopgDriver:
    """A psycopg_pool (opened on first use) and the owner lock.

    While the server is down, an operation fails after at most ``pool_timeout`` seconds (the
    pool keeps trying to reconnect in the background).

    Args:
        statements: the store's statements (and, as their ``options``, its options).
    """

    def __init__(self, statements: Statements) -> None:
        self.statements = statements
        self.options: PostgresOptions = statements.options
        self._pool: Any = None
        self._lock = threading.Lock()
        # Owner liveness: the dedicated connection holding this process's owner lock.
        self._owner_conn: Any = None
        self._owner_instance = ""
        self._owner_lock = threading.Lock()
        self._owner_retry_at = 0.0
        # Every connection the pool opened (for a forked child to leave alone).
        self._conns: weakref.WeakSet[Any] = weakref.WeakSet()
        reset_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: the parent's pool and owner connection are never used, and their
        sockets are pointed away (a finalizer's goodbye would end the parent's sessions, and with
        them its owner lock); the next operation opens a pool of the child's own."""
        inherited = [*self._conns, self._owner_conn]
        for conn in inherited:
            if conn is not None and not conn.closed:
                neuter_socket(conn.pgconn.socket)
        INHERITED.append((self._pool, inherited))
        self._pool = self._owner_conn = None
        self._conns = weakref.WeakSet()
        self._lock = threading.Lock()
        self._owner_lock = threading.Lock()

    def _connect_kwargs(self) -> dict[str, Any]:
        return {
            "autocommit": True,
            # libpq takes whole seconds (and treats values below 2 as 2).
            "connect_timeout": max(2, math.ceil(self.options.connect_timeout)),
            "application_name": self.options.application_name,
        }

    def _open(self) -> Any:
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
                configure=self._conns.add,
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
        try:
            with conn.transaction():
                op = ensure_schema_op(self.statements, only_if_missing=only_if_missing)
                drive(op, _OnConnection(conn))
        except psycopg.Error as exc:
            raise _psycopg_error(exc, what="schema set-up") from exc

    def ensure_schema(self) -> None:
        """Create the table and its index if missing, in one transaction."""
        pool = self._pool or self._open()
        try:
            with pool.connection(timeout=self.options.pool_timeout) as conn:
                self._ensure_schema_on(conn, only_if_missing=False)
        except StoreError:
            raise
        except Exception as exc:
            raise _psycopg_error(exc, what="schema set-up") from exc

    def perform(self, query: Query) -> Rows:
        """Send one statement on a pooled connection and return its rows (for :func:`drive`)."""
        pool = self._pool or self._open()
        what = query.statement.name
        try:
            conn = pool.getconn(timeout=self.options.pool_timeout)
        except Exception as exc:
            raise _psycopg_error(exc, what=what) from exc
        try:
            # $n placeholders, as in the .sql file: no client-side query rewriting. A raw cursor
            # of its own, never the connection's factory: a connection handed to a handler
            # (transaction()) takes psycopg's own %s placeholders, as any does.
            cur = psycopg.RawCursor(conn).execute(query.statement.sql, query.args, prepare=True)
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

    # -- owner liveness --------------------------------------------------------------------------

    def owner_held(self) -> bool:
        """Whether this process's owner lock is held, on a session the server has not ended."""
        conn = self._owner_conn
        if conn is None or self._owner_instance != instance_id() or conn.closed or conn.broken:
            return False
        # psycopg notices a closed session only on use. An idle connection has nothing to read
        # unless the server ended it (a notice, then EOF): one zero-timeout poll tells.
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
        return not readable

    def hold_owner_lock(self) -> bool:
        """Take this process's owner lock, as :meth:`AsyncpgDriver.hold_owner_lock` does
        (a thread lock, and no event loop to bind the connection to)."""
        with self._owner_lock:
            if self.owner_held():
                return True
            instance = instance_id()
            if time.monotonic() < self._owner_retry_at and self._owner_instance == instance:
                return False
            conn, self._owner_conn = self._owner_conn, None
            if conn is not None:
                conn.close()  # the child's own: a parent's was dropped at the fork
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
                query = owner_lock_query(self.statements, instance)
                psycopg.RawCursor(conn).execute(query.statement.sql, query.args).fetchall()
            except (psycopg.Error, OSError) as exc:
                logger.warning("owner liveness off for now (lock failed): %s", exc)
                conn.close()
                return False
            self._owner_conn = conn
            return True

    def close(self) -> None:
        """Close the pool and end the owner lock's session."""
        owner, self._owner_conn = self._owner_conn, None
        if owner is not None and self._owner_instance == instance_id():
            owner.close()
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    # -- a request's transaction -----------------------------------------------------------------
    # A lost connection is never a ConnectionLostError here: the transaction died with it, so
    # no statement of it may be repeated on another connection.

    def begin(self) -> _Tx:
        """A pooled connection with a transaction begun (the pool's are in autocommit)."""
        pool = self._pool or self._open()
        try:
            conn = pool.getconn(timeout=self.options.pool_timeout)
        except Exception as exc:
            raise _psycopg_error(exc, what="begin") from exc
        try:
            conn.execute("BEGIN")
        except Exception as exc:
            pool.putconn(conn)
            raise _psycopg_error(exc, what="begin") from exc
        return _Tx(pool, conn)

    @staticmethod
    def _execute(tx: _Tx, sql: str, args: Sequence[Any] = (), *, what: str) -> Rows:
        try:
            cur = psycopg.RawCursor(tx.conn).execute(sql, args)
            return cur.fetchall() if cur.description else []
        except Exception as exc:
            raise _psycopg_error(exc, what=what) from exc

    def tx_fetch(self, tx: _Tx, query: Query) -> Rows:
        """Send one statement in the transaction."""
        return self._execute(tx, query.statement.sql, query.args, what=query.statement.name)

    def commit(self, tx: _Tx) -> None:
        """Commit the transaction."""
        tx.open = False
        self._execute(tx, "COMMIT", what="commit")

    def rollback(self, tx: _Tx) -> None:
        """Roll the transaction back (nothing when it has ended)."""
        if tx.open:
            tx.open = False
            self._execute(tx, "ROLLBACK", what="rollback")

    def end(self, tx: _Tx) -> None:
        """Roll back anything not committed and give the connection back to the pool (which
        discards it if it is broken)."""
        if tx.open:
            tx.open = False
            try:
                tx.conn.execute("ROLLBACK")
            except Exception as exc:
                logger.debug("rollback on close failed: %s", exc)
        tx.pool.putconn(tx.conn)

    def broken(self, tx: _Tx) -> bool:
        """Whether the transaction's connection died (a terminated backend, a lost socket)."""
        return bool(tx.conn.broken or tx.conn.closed)
