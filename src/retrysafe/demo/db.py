"""OrderHub's own data: orders and payments, in SQLite or PostgreSQL (``--db``).

In transactional mode the handler passes the connection of its idempotent transaction
(:func:`retrysafe.transaction`) and the order commits together with the stored response.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar
from urllib.parse import parse_qs

from .._core.errors import ConfigurationError, StoreUnavailableError
from ..stores.sqlite import (
    DEFAULT_BUSY_TIMEOUT,
    SQLiteBusyError,
    busy_timeout_option,
    parse_sqlite_url,
    retry_while_busy,
)

__all__ = ["DatabaseUnavailable", "OrderDB", "PostgresOrderDB", "SQLiteOrderDB", "open_db"]


class DatabaseUnavailable(StoreUnavailableError):
    """OrderHub's own database stayed busy (SQLite's single writer) or could not be reached;
    nothing was written. The app answers ``503`` + ``Retry-After``."""


T = TypeVar("T")

_POOL_SIZE = 4

_COLUMNS = {
    "orders": ("id", "owner", "item", "quantity", "created_at"),
    "payments": ("id", "owner", "amount", "currency", "created_at"),
}

_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS orderhub_orders (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    owner TEXT NOT NULL,
    item TEXT NOT NULL,
    quantity INTEGER NOT NULL,
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE TABLE IF NOT EXISTS orderhub_payments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    owner TEXT NOT NULL,
    amount INTEGER NOT NULL,
    currency TEXT NOT NULL,
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
"""

_POSTGRES_SCHEMA = """
CREATE TABLE IF NOT EXISTS orderhub_orders (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner TEXT NOT NULL,
    item TEXT NOT NULL,
    quantity BIGINT NOT NULL,
    created_at TEXT NOT NULL
        DEFAULT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
);
CREATE TABLE IF NOT EXISTS orderhub_payments (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner TEXT NOT NULL,
    amount BIGINT NOT NULL,
    currency TEXT NOT NULL,
    created_at TEXT NOT NULL
        DEFAULT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
);
"""


def _insert_sql(table: str, kind: str, names: tuple[str, ...], marks: list[str]) -> str:
    return (
        f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join(marks)}) "
        f"RETURNING {', '.join(_COLUMNS[kind])}"
    )


def _select_sql(table: str, kind: str) -> str:
    return f"SELECT {', '.join(_COLUMNS[kind])} FROM {table}"


class OrderDB(Protocol):
    """What OrderHub needs of its database."""

    url: str

    async def add(self, kind: str, owner: str, conn: Any = None, **values: Any) -> dict[str, Any]:
        """Insert an order or payment (on ``conn`` when given) and return it."""
        ...

    async def list(self, kind: str, limit: int | None = None) -> tuple[int, list[dict[str, Any]]]:
        """Return (total count, newest first, at most ``limit``)."""
        ...

    async def get(self, kind: str, record_id: int) -> dict[str, Any] | None:
        """Return one record or ``None``."""
        ...

    async def reset(self) -> None:
        """Delete every order and payment."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


class SQLiteOrderDB:
    """Orders in a SQLite file; statements run inline (each is ~20 us).

    A write that meets another writer's lock (a transactional request between its first write
    and its commit) waits for it the way the store does, with an awaited back-off, up to
    ``busy_timeout`` (URL option, default :data:`~retrysafe.stores.sqlite.DEFAULT_BUSY_TIMEOUT`);
    after that it raises :class:`~retrysafe.stores.sqlite.SQLiteBusyError`, which the app
    answers with ``503`` + ``Retry-After``.

    Args:
        url: ``sqlite:///path.db``, shared by every OrderHub process pointed at it.

    Raises:
        ConfigurationError: a bad URL option.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.path, options = parse_sqlite_url(url)
        busy = busy_timeout_option(options)
        self.busy_timeout = DEFAULT_BUSY_TIMEOUT if busy is None else busy
        self._local = threading.local()
        self._conn()  # create the tables at start-up, not inside a request's transaction

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            # No blocking wait for the write lock: in transactional mode the request that holds
            # it runs on this very event loop. Busy writes are retried after an awaited pause.
            conn.execute("PRAGMA busy_timeout = 0")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA busy_timeout = 5000")  # set-up only, at start-up
            conn.executescript(_SQLITE_SCHEMA)
            conn.execute("PRAGMA busy_timeout = 0")
            self._local.conn = conn
        return conn

    async def _write(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        conn = self._conn()
        try:
            return await retry_while_busy(
                lambda: conn.execute(sql, params).fetchone(),
                busy_timeout=self.busy_timeout,
                what="write",
            )
        except SQLiteBusyError as exc:
            raise DatabaseUnavailable(str(exc), store="sqlite") from exc

    async def add(self, kind: str, owner: str, conn: Any = None, **values: Any) -> dict[str, Any]:
        """Insert an order or payment (in ``conn``'s transaction when given) and return it."""
        names = ("owner", *values)
        sql = _insert_sql(f"orderhub_{kind}", kind, names, ["?"] * len(names))
        params = (owner, *values.values())
        row = conn.execute(sql, params).fetchone() if conn else await self._write(sql, params)
        return dict(zip(_COLUMNS[kind], row, strict=True))

    async def list(self, kind: str, limit: int | None = None) -> tuple[int, list[dict[str, Any]]]:
        """Return (total count, records newest first, at most ``limit``)."""
        conn = self._conn()
        (count,) = conn.execute(f"SELECT count(*) FROM orderhub_{kind}").fetchone()
        sql = _select_sql(f"orderhub_{kind}", kind) + " ORDER BY id DESC"
        params: tuple[int, ...] = ()
        if limit is not None:
            sql += " LIMIT ?"
            params = (limit,)
        rows = conn.execute(sql, params).fetchall()
        return count, [dict(zip(_COLUMNS[kind], r, strict=True)) for r in rows]

    async def get(self, kind: str, record_id: int) -> dict[str, Any] | None:
        """Return one record or ``None``."""
        sql = _select_sql(f"orderhub_{kind}", kind) + " WHERE id = ?"
        row = self._conn().execute(sql, (record_id,)).fetchone()
        return None if row is None else dict(zip(_COLUMNS[kind], row, strict=True))

    async def reset(self) -> None:
        """Delete every order and payment."""
        await self._write("DELETE FROM orderhub_orders")
        await self._write("DELETE FROM orderhub_payments")

    async def aclose(self) -> None:
        """Nothing to release (connections close with the process)."""


class PostgresOrderDB:
    """Orders in PostgreSQL through an asyncpg pool (created on first use).

    Args:
        url: ``postgresql://...``; ``?schema=NAME`` keeps the tables in that schema.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        base, _, query = url.partition("?")
        self._dsn = base
        self._schema = parse_qs(query).get("schema", [None])[-1]
        if self._schema is not None and not self._schema.replace("_", "").isalnum():
            raise ConfigurationError(f"invalid schema name {self._schema!r}")
        # Qualified names: in transactional mode the insert runs on the store's connection,
        # whose search_path is not ours.
        self._prefix = f'"{self._schema}".' if self._schema else ""
        self._pool: Any = None
        self._lock: asyncio.Lock | None = None

    def _table(self, kind: str) -> str:
        return f"{self._prefix}orderhub_{kind}"

    async def _get_pool(self) -> Any:
        if self._pool is not None:
            return self._pool
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # concurrent first requests must not open two pools
            return await self._open_pool()

    async def _open_pool(self) -> Any:
        if self._pool is None:
            import asyncpg

            settings = {"search_path": self._schema} if self._schema else {}
            pool = await asyncpg.create_pool(
                self._dsn, min_size=1, max_size=_POOL_SIZE, server_settings=settings
            )
            async with pool.acquire() as conn:
                if self._schema:
                    await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self._schema}"')
                # Concurrent first requests of several instances: serialize the DDL.
                async with conn.transaction():
                    await conn.execute("SELECT pg_advisory_xact_lock(7206110)")
                    await conn.execute(_POSTGRES_SCHEMA)
            self._pool = pool
        return self._pool

    async def _run(self, work: Callable[[Any], Awaitable[T]]) -> T:
        """Run ``work`` on a pooled connection, with the store's pool hygiene: a connection
        that failed is discarded, one the server closed while idle is skipped (nothing was
        sent), and a lost server is :class:`DatabaseUnavailable` (a 503)."""
        from ..stores.postgres._asyncpg import _asyncpg_error, _discard, _give_back, _never_sent

        pool = await self._get_pool()
        for _ in range(_POOL_SIZE + 1):
            try:
                conn = await asyncio.wait_for(pool.acquire(), 10.0)
            except Exception as exc:
                error = _asyncpg_error(exc, established=False, what="connect")
                raise DatabaseUnavailable(str(error), store="postgres") from exc
            try:
                return await work(conn)
            except Exception as exc:
                closed = conn.is_closed()
                _discard(conn)
                if _never_sent(exc):
                    continue
                error = _asyncpg_error(exc, established=True, what="statement", closed=closed)
                if isinstance(error, StoreUnavailableError):
                    raise DatabaseUnavailable(str(error), store="postgres") from exc
                raise
            finally:
                await _give_back(pool, conn)
        raise DatabaseUnavailable("no live connection to the order database", store="postgres")

    async def add(self, kind: str, owner: str, conn: Any = None, **values: Any) -> dict[str, Any]:
        """Insert an order or payment (in ``conn``'s transaction when given) and return it."""
        names = ("owner", *values)
        marks = [f"${i + 1}" for i in range(len(names))]
        sql = _insert_sql(self._table(kind), kind, names, marks)
        if conn is None:
            row = await self._run(lambda own: own.fetchrow(sql, owner, *values.values()))
        else:
            await self._get_pool()  # the tables exist
            try:
                row = await conn.fetchrow(sql, owner, *values.values())
            except Exception as exc:
                from ..stores.postgres._asyncpg import _asyncpg_error

                # The transaction's connection died under the handler: a store failure that
                # the middleware answers (503, the key released), told in plain words.
                error = _asyncpg_error(
                    exc, established=False, what="insert", closed=conn.is_closed()
                )
                if isinstance(error, StoreUnavailableError):
                    raise error from exc
                raise
        return dict(row)

    async def list(self, kind: str, limit: int | None = None) -> tuple[int, list[dict[str, Any]]]:
        """Return (total count, records newest first, at most ``limit``)."""
        sql = _select_sql(self._table(kind), kind) + " ORDER BY id DESC"

        async def work(conn: Any) -> tuple[Any, Any]:
            count = await conn.fetchval(f"SELECT count(*) FROM {self._table(kind)}")
            rows = await (
                conn.fetch(sql + " LIMIT $1", limit) if limit is not None else conn.fetch(sql)
            )
            return count, rows

        count, rows = await self._run(work)
        return int(count), [dict(r) for r in rows]

    async def get(self, kind: str, record_id: int) -> dict[str, Any] | None:
        """Return one record or ``None``."""
        sql = _select_sql(self._table(kind), kind) + " WHERE id = $1"
        row = await self._run(lambda conn: conn.fetchrow(sql, record_id))
        return None if row is None else dict(row)

    async def reset(self) -> None:
        """Delete every order and payment."""

        async def work(conn: Any) -> None:
            for kind in _COLUMNS:
                await conn.execute(f"DELETE FROM {self._table(kind)}")

        await self._run(work)

    async def aclose(self) -> None:
        """Close the pool."""
        if self._pool is not None:
            await self._pool.close()


def open_db(url: str) -> OrderDB:
    """Open the demo database a URL names (``sqlite:///path.db`` or ``postgresql://...``).

    Raises:
        ConfigurationError: another scheme.
    """
    if url.startswith("sqlite:///"):
        return SQLiteOrderDB(url)
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresOrderDB(url)
    raise ConfigurationError(
        f"OrderHub keeps its data in SQLite (sqlite:///...) or PostgreSQL, got {url!r}"
    )
