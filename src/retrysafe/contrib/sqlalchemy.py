"""SQLAlchemy 2.x sessions on the idempotent transaction (transactional mode).

The handler's ORM writes commit together with the stored response::

    from retrysafe.contrib.sqlalchemy import async_session, session

    @app.post("/orders")
    async def create(request):                      # PostgreSQL store (asyncpg)
        db = await async_session(request)
        db.add(Order(item="tea"))
        await db.flush()                            # no commit: retrysafe commits with the record
        ...

    @app.post("/orders")
    async def create(request):                      # SQLite store
        db = await session(request)
        db.add(Order(item="tea"))
        db.flush()

``async_session`` on a MySQL/MariaDB store (asyncmy) works the same way as on PostgreSQL.

Pending changes are flushed, and the session closed, when the response is final (the library does
it: a handler need not commit or close). The session runs on the very connection of the request's
transaction. SQLAlchemy may not end that transaction: on PostgreSQL its own transaction is a
savepoint inside ours (asyncpg nests transactions as savepoints), on SQLite and MySQL the
DB-API connection it sees ignores ``commit``, ``rollback`` and ``close``. So ``session.commit()``
is harmless but commits nothing by itself: the commit happens, with the idempotency record, when
the response is final.

Engines are created once per dialect and hand out the current request's connection (a context
variable), with ``NullPool``: SQLAlchemy never keeps a connection it does not own.

Inside an idempotent function (``transactional=True``) no request is passed: ``await
async_session()`` / ``await session()`` in an ``async def``, :func:`call_session` in a ``def``
(SQLite, PostgreSQL or MySQL); the session's writes commit with the call's stored result.
"""

from __future__ import annotations

import contextvars
import functools
import sqlite3
from typing import Any

from .._core.transaction import context_transaction, current_context, transaction
from ._extra import extra

with extra("sqlalchemy"):
    from sqlalchemy import create_engine
    from sqlalchemy.engine import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
    from sqlalchemy.orm import Session
    from sqlalchemy.pool import NullPool

__all__ = ["async_session", "call_session", "session"]

_current: contextvars.ContextVar[Any] = contextvars.ContextVar("retrysafe_sqlalchemy_connection")


class _Lent:
    """A connection retrysafe lends SQLAlchemy for one request or call: every attribute passes
    through to it, except the methods a subclass ignores."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class _LentSync(_Lent):
    """Ending the transaction or the connection is ignored (both belong to retrysafe)."""

    def commit(self) -> None:
        """Ignored: retrysafe commits with the idempotency record."""

    def rollback(self) -> None:
        """Ignored: retrysafe rolls back when the request or call fails."""

    def close(self) -> None:
        """Ignored: the connection goes back to retrysafe's pool."""


class _SQLiteConnection(_LentSync):
    """The request's ``sqlite3.Connection`` as SQLAlchemy sees it."""


class _AsyncpgConnection(_Lent):
    """The request's ``asyncpg.Connection`` as SQLAlchemy sees it: ``close``/``terminate`` are
    ignored (the connection goes back to retrysafe's pool)."""

    async def close(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 (asyncpg's signature)
        """Ignored."""

    def terminate(self) -> None:
        """Ignored."""


class _PsycopgConnection(_LentSync):
    """The call's ``psycopg.Connection`` as SQLAlchemy sees it: its own (client-side binding)
    cursors, since the store's connections use PostgreSQL's ``$1`` placeholders."""

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        import psycopg

        return psycopg.Cursor(self._conn)


class _PyMySQLConnection(_LentSync):
    """The call's ``pymysql.Connection`` as SQLAlchemy sees it: switching autocommit on is
    ignored too."""

    def autocommit(self, value: bool) -> None:
        """Ignored: the connection stays in the idempotent transaction."""


class _AsyncmyConnection(_Lent):
    """The request's ``asyncmy.Connection`` as SQLAlchemy sees it: as for PyMySQL, with the
    awaitable methods that SQLAlchemy's asyncmy adapter calls."""

    async def commit(self) -> None:
        """Ignored: retrysafe commits with the idempotency record."""

    async def rollback(self) -> None:
        """Ignored: retrysafe rolls back when the request fails."""

    async def ensure_closed(self) -> None:
        """Ignored: the connection goes back to retrysafe's pool."""

    def close(self) -> None:
        """Ignored."""

    async def autocommit(self, value: bool) -> None:
        """Ignored: the connection stays in the idempotent transaction."""


def _is_mysql(conn: Any) -> bool:
    return type(conn).__module__.partition(".")[0] in ("pymysql", "asyncmy")


# One engine per driver and process, built on first use: its "connections" are the current
# transaction's, handed out by the creator.
@functools.cache
def _psycopg_engine() -> Engine:
    return create_engine(
        "postgresql+psycopg://",
        creator=lambda: _PsycopgConnection(_current.get()),
        poolclass=NullPool,
        use_native_hstore=False,  # its set-up would register types on retrysafe's connection
    )


@functools.cache
def _sqlite_engine() -> Engine:
    return create_engine(
        "sqlite://", creator=lambda: _SQLiteConnection(_current.get()), poolclass=NullPool
    )


@functools.cache
def _pymysql_engine() -> Engine:
    return create_engine(
        "mysql+pymysql://", creator=lambda: _PyMySQLConnection(_current.get()), poolclass=NullPool
    )


@functools.cache
def _asyncmy_engine() -> AsyncEngine:
    async def creator() -> Any:
        return _AsyncmyConnection(_current.get())

    return create_async_engine("mysql+asyncmy://", async_creator=creator, poolclass=NullPool)


@functools.cache
def _asyncpg_engine() -> AsyncEngine:
    async def creator() -> Any:
        return _AsyncpgConnection(_current.get())

    return create_async_engine("postgresql+asyncpg://", async_creator=creator, poolclass=NullPool)


async def _use_connection(request: Any, *, sqlite: bool, mismatch: str) -> Any:
    """Make the request's transaction connection the one the engines hand out, and return it;
    ``TypeError`` (``mismatch``) when the store is not the kind the session needs (``sqlite``
    or not)."""
    conn = await transaction(request)
    if isinstance(conn, sqlite3.Connection) != sqlite:
        raise TypeError(mismatch)
    _current.set(conn)
    return conn


def _end(db: Session, ok: bool) -> None:
    """Flush (its COMMIT is ignored by the connection) and close a session on our
    transaction."""
    if ok:
        db.commit()
    db.close()


async def session(request: Any = None, **kwargs: Any) -> Session:
    """A SQLAlchemy ``Session`` on the request's SQLite transaction.

    Args:
        request: a Starlette/FastAPI ``Request`` or an ASGI scope; nothing inside an idempotent
            ``async def`` function (its call's transaction).
        **kwargs: passed to ``Session`` (e.g. ``expire_on_commit=False``).

    Raises:
        ConfigurationError: the request has no idempotent transaction.
        TypeError: the store is not SQLite (use :func:`async_session`).
    """
    mismatch = "session() needs a SQLite store; use async_session() for PostgreSQL or MySQL"
    await _use_connection(request, sqlite=True, mismatch=mismatch)
    db = Session(bind=_sqlite_engine(), **kwargs)

    async def finish(ok: bool) -> None:
        _end(db, ok)

    current_context(request).add_finalizer(finish)
    return db


async def async_session(request: Any = None, **kwargs: Any) -> AsyncSession:
    """A SQLAlchemy ``AsyncSession`` on the request's PostgreSQL (asyncpg) or MySQL (asyncmy)
    transaction.

    Args:
        request: a Starlette/FastAPI ``Request`` or an ASGI scope; nothing inside an idempotent
            ``async def`` function (its call's transaction).
        **kwargs: passed to ``AsyncSession``.

    Raises:
        ConfigurationError: the request has no idempotent transaction.
        TypeError: the store is SQLite (use :func:`session`).
    """
    mismatch = "async_session() needs a PostgreSQL or MySQL store; use session() for SQLite"
    conn = await _use_connection(request, sqlite=False, mismatch=mismatch)
    engine = _asyncmy_engine() if _is_mysql(conn) else _asyncpg_engine()
    db = AsyncSession(bind=engine, **kwargs)

    async def finish(ok: bool) -> None:
        if ok:
            await db.commit()  # flushes (PostgreSQL: releases its savepoint inside ours)
        await db.close()

    current_context(request).add_finalizer(finish)
    return db


def call_session(**kwargs: Any) -> Session:
    """A SQLAlchemy ``Session`` on the running idempotent ``def`` function's transaction
    (SQLite, PostgreSQL or MySQL): its writes commit together with the call's stored result.

    Args:
        **kwargs: passed to ``Session``.

    Raises:
        ConfigurationError: not inside an idempotent ``def`` function in transactional mode.
    """
    tx = context_transaction(None, optional=False)
    conn = tx.connection()
    _current.set(conn)
    if isinstance(conn, sqlite3.Connection):
        engine = _sqlite_engine()
    elif _is_mysql(conn):
        engine = _pymysql_engine()
    else:
        engine = _psycopg_engine()
    db = Session(bind=engine, **kwargs)
    current_context(None).add_finalizer(functools.partial(_end, db))
    return db
