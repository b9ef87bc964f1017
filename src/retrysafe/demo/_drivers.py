"""OrderHub's database drivers: its SQL, and one small adapter per driver.

Each adapter has ``sql`` (the :class:`Statements` of its dialect), ``run(sql, params, conn=...,
write=...)`` returning the rows, and ``aclose()`` / ``close()``; the data layer over them is
written once (``_async_hub.py``, its sync twin generated). With ``conn`` (the connection of a
request's idempotent transaction, transactional mode) the statement runs on it and commits with
the stored response; without, on the adapter's own connection in autocommit mode.

The adapters are hand-written because they differ in more than ``await``: asyncpg and psycopg
are different libraries, and SQLite waits differently on each face. The async face calls SQLite
inline on the event loop and must never block it (the request that holds the write lock may run
on that same loop), so it waits for a busy write with an awaited back-off
(:func:`~retrysafe.stores.sqlite.retry_while_busy`); the sync face runs on a worker thread, where
SQLite's own blocking ``busy_timeout`` is the simple wait. Both wait up to the same bound
(``?busy_timeout=`` seconds in the URL, else
:data:`~retrysafe.stores.sqlite.DEFAULT_BUSY_TIMEOUT`), then raise
:class:`~retrysafe.demo.domain.DatabaseUnavailable` (a ``503``), never a 500.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs

from .. import ConfigurationError, StoreError, StoreUnavailableError
from ..stores.sqlite import (
    DEFAULT_BUSY_TIMEOUT,
    SQLiteBusyError,
    busy_timeout_option,
    file_key,
    parse_sqlite_url,
    retry_while_busy,
)
from .domain import ORDERS, PAYMENTS, DatabaseUnavailable, Kind

__all__ = [
    "AsyncSQLite",
    "Asyncmy",
    "Asyncpg",
    "Psycopg",
    "PyMySQL",
    "Statements",
    "SyncSQLite",
    "open_async_driver",
    "open_driver",
    "record",
]

T = TypeVar("T")
Rows = Sequence[Sequence[Any]]

_POOL_SIZE = 4
#: Serialises the CREATE TABLEs of several processes starting at once (an advisory lock id).
_DDL_LOCK = 7206110

#: OrderHub's tables (``orderhub_<name>``): each column a client or the worker writes, by type,
#: then the column stamped with the time of the insert (ISO 8601, UTC, milliseconds).
_TABLES: dict[str, tuple[dict[str, type], str]] = {
    ORDERS.name: ({"owner": str, **ORDERS.fields}, "created_at"),
    PAYMENTS.name: ({"owner": str, **PAYMENTS.fields}, "created_at"),
    "charges": (
        {"payment_id": int, "flow": str, "amount": int, "currency": str, "task_id": str},
        "created_at",
    ),
    "charge_runs": (
        {"payment_id": int, "flow": str, "task_id": str, "pid": int, "outcome": str},
        "started_at",
    ),
}


@dataclass(frozen=True, slots=True)
class _Dialect:
    """What the ``CREATE TABLE`` of a table says differently in each SQL dialect."""

    identity: str
    integer: str
    stamp: str
    suffix: str = ""

    def statements(self, prefix: str = "") -> list[str]:
        """The statements that create every table that is missing (``prefix`` qualifies)."""
        statements = []
        for name, (columns, stamp) in _TABLES.items():
            lines = [
                f"id {self.identity}",
                *(
                    f"{column} {self.integer if kind is int else 'TEXT'} NOT NULL"
                    for column, kind in columns.items()
                ),
                f"{stamp} {self.stamp}",
            ]
            body = ",\n    ".join(lines)
            statements.append(
                f"CREATE TABLE IF NOT EXISTS {prefix}orderhub_{name} (\n    {body}\n){self.suffix}"
            )
        return statements

    def schema(self, prefix: str = "") -> str:
        """:meth:`statements` as one script."""
        return "".join(f"{statement};\n" for statement in self.statements(prefix))


_SQLITE = _Dialect(
    "INTEGER PRIMARY KEY AUTOINCREMENT",
    "INTEGER",
    "TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
)
_POSTGRES = _Dialect(
    "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
    "BIGINT",
    "TEXT NOT NULL DEFAULT "
    "to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')",
)
#: MySQL's stamp is written by each insert (a column default may not call UTC_TIMESTAMP there).
_MYSQL = _Dialect(
    "BIGINT AUTO_INCREMENT PRIMARY KEY",
    "BIGINT",
    "VARCHAR(32) NOT NULL DEFAULT ''",
    " ENGINE = InnoDB",
)
_MYSQL_SCHEMA = _MYSQL.statements()
#: MySQL's created_at (no RETURNING, and a column default may not call UTC_TIMESTAMP on MySQL).
_MYSQL_NOW = "CONCAT(LEFT(DATE_FORMAT(UTC_TIMESTAMP(3), '%%Y-%%m-%%dT%%H:%%i:%%s.%%f'), 23), 'Z')"


class Statements:
    """OrderHub's statements in one dialect.

    Args:
        prefix: qualifies the tables (``'"schema".'``; in transactional mode the statements run
            on the store's connection, whose ``search_path`` is not ours).
        numbered: ``$1, $2`` placeholders (PostgreSQL) rather than ``?`` (SQLite).
        mysql: ``%s`` placeholders, and an insert without ``RETURNING`` (MySQL has none): two
            statements, the insert and the read of its row, that :class:`Asyncmy` and
            :class:`PyMySQL` run on one connection.
    """

    def __init__(self, prefix: str = "", *, numbered: bool = False, mysql: bool = False) -> None:
        self.prefix = prefix
        self.numbered = numbered
        self.mysql = mysql

    def _table(self, kind: Kind) -> str:
        return f"{self.prefix}orderhub_{kind.name}"

    def _mark(self, position: int) -> str:
        return "%s" if self.mysql else f"${position}" if self.numbered else "?"

    def _select(self, kind: Kind) -> str:
        return f"SELECT {', '.join(kind.columns)} FROM {self._table(kind)}"

    def insert(self, kind: Kind) -> str:
        """Insert a record (``owner`` then the kind's fields) and return it."""
        return self._insert(kind.name, kind.columns)

    def insert_id(self, name: str) -> str:
        """Insert a row of ``orderhub_<name>`` (its columns in :data:`_TABLES` order, the
        stamp left to the database) and return its id."""
        return self._insert(name, ("id",))

    def _insert(self, name: str, returned: Sequence[str]) -> str:
        columns, stamp = _TABLES[name]
        table = f"{self.prefix}orderhub_{name}"
        marks = ", ".join(self._mark(i + 1) for i in range(len(columns)))
        if self.mysql:
            return (
                f"INSERT INTO {table} ({', '.join(columns)}, {stamp}) "
                f"VALUES ({marks}, {_MYSQL_NOW})"
                f"{MYSQL_THEN}SELECT {', '.join(returned)} FROM {table} "
                "WHERE id = LAST_INSERT_ID()"
            )
        return (
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks}) "
            f"RETURNING {', '.join(returned)}"
        )

    def count(self, kind: Kind) -> str:
        """How many records there are."""
        return f"SELECT count(*) FROM {self._table(kind)}"

    def newest(self, kind: Kind, *, limited: bool) -> str:
        """Records newest first (at most the one parameter, when ``limited``)."""
        sql = self._select(kind) + " ORDER BY id DESC"
        return sql + f" LIMIT {self._mark(1)}" if limited else sql

    def by_id(self, kind: Kind) -> str:
        """The record of one id."""
        return self._select(kind) + f" WHERE id = {self._mark(1)}"

    def delete(self, kind: Kind) -> str:
        """Delete every record."""
        return f"DELETE FROM {self._table(kind)}"


#: Between the two statements of a MySQL insert.
MYSQL_THEN = "\n;\n"


def record(kind: Kind, row: Sequence[Any]) -> dict[str, Any]:
    """A row as the JSON answer's object."""
    return dict(zip(kind.columns, row, strict=True))


def _busy(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


class _SQLite:
    """What both SQLite faces share: the file, the bound of a busy wait, a connection per
    thread (set up with the tables on first use)."""

    sql = Statements()

    def __init__(self, url: str) -> None:
        self.path, options = parse_sqlite_url(url)
        busy = busy_timeout_option(options)
        self.busy_timeout = DEFAULT_BUSY_TIMEOUT if busy is None else busy
        self._local = threading.local()
        self._conn()  # the tables exist from start-up on, never created inside a transaction

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {int(max(self.busy_timeout, 5.0) * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.executescript(_SQLITE.schema())
            conn.execute(f"PRAGMA busy_timeout = {self._wait_ms()}")
            self._local.conn = conn
        return conn

    def _wait_ms(self) -> int:
        raise NotImplementedError

    def _unavailable(self, exc: BaseException) -> DatabaseUnavailable:
        return DatabaseUnavailable(
            f"SQLite write: the database's write lock stayed taken for {self.busy_timeout:g} s "
            "(busy_timeout); another transaction holds it",
            store="sqlite",
        )

    def _close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


class AsyncSQLite(_SQLite):
    """SQLite for the async apps: inline calls (about 20 us each), busy writes retried after an
    awaited back-off, so the event loop keeps serving the request that holds the lock."""

    def _wait_ms(self) -> int:
        return 0  # never a blocking wait on the event loop

    async def run(
        self, sql: str, params: Sequence[Any] = (), *, conn: Any = None, write: bool = False
    ) -> Rows:
        """Run one statement; see the module docstring."""
        if conn is not None:
            return conn.execute(sql, params).fetchall()  # type: ignore[no-any-return]
        own = self._conn()
        if not write:  # WAL readers never wait for the writer
            return own.execute(sql, params).fetchall()
        try:
            return await retry_while_busy(
                lambda: own.execute(sql, params).fetchall(),
                busy_timeout=self.busy_timeout,
                what="write",
                path=file_key(self.path),  # in turn with the store's waiters on this file
            )
        except SQLiteBusyError as exc:
            raise self._unavailable(exc) from exc

    async def aclose(self) -> None:
        """Close this thread's connection."""
        self._close()


class SyncSQLite(_SQLite):
    """SQLite for the WSGI apps: one connection per worker thread, SQLite's own blocking wait."""

    def _wait_ms(self) -> int:
        return int(self.busy_timeout * 1000)

    def run(
        self, sql: str, params: Sequence[Any] = (), *, conn: Any = None, write: bool = False
    ) -> Rows:
        """Run one statement; see the module docstring."""
        try:
            return (conn or self._conn()).execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if conn is None and _busy(exc):
                raise self._unavailable(exc) from exc
            raise

    def close(self) -> None:
        """Close this thread's connection."""
        self._close()


class _Postgres:
    """What both PostgreSQL adapters share: the DSN, the schema of ``?schema=NAME`` and the
    statements qualified with it.

    Raises:
        ConfigurationError: a schema name that is not a plain identifier.
    """

    def __init__(self, url: str) -> None:
        self._dsn, _, query = url.partition("?")
        self._schema = parse_qs(query).get("schema", [None])[-1]
        if self._schema is not None and not self._schema.replace("_", "").isalnum():
            raise ConfigurationError(f"invalid schema name {self._schema!r}")
        self.sql = Statements(f'"{self._schema}".' if self._schema else "", numbered=True)
        self._pool: Any = None

    def _setup(self) -> list[str]:
        """The statements that create the tables, serialised across processes by a lock."""
        schema = [f'CREATE SCHEMA IF NOT EXISTS "{self._schema}"'] if self._schema else []
        lock = f"SELECT pg_advisory_xact_lock({_DDL_LOCK})"
        return [*schema, "BEGIN", lock, _POSTGRES.schema(self.sql.prefix), "COMMIT"]


class Asyncpg(_Postgres):
    """PostgreSQL for the async apps through an asyncpg pool (opened on first use), with the
    store's pool hygiene: a connection that failed is discarded, one the server closed while
    idle is skipped (nothing was sent), and a lost server is :class:`DatabaseUnavailable`.

    Args:
        url: ``postgresql://...``; ``?schema=NAME`` keeps the tables in that schema.
    """

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self._lock: asyncio.Lock | None = None

    async def _get_pool(self) -> Any:
        if self._pool is None:
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:  # concurrent first requests must not open two pools
                if self._pool is None:
                    self._pool = await self._open_pool()
        return self._pool

    async def _open_pool(self) -> Any:
        import asyncpg

        pool = await asyncpg.create_pool(self._dsn, min_size=1, max_size=_POOL_SIZE)
        async with pool.acquire() as conn:
            for statement in self._setup():
                await conn.execute(statement)
        return pool

    async def _pooled(self, work: Callable[[Any], Awaitable[T]]) -> T:
        from ..stores.postgres.pooled import run_pooled

        pool = await self._get_pool()
        try:
            return await run_pooled(pool, work, attempts=_POOL_SIZE + 1)
        except StoreError as exc:  # no connection, or the server went away
            raise DatabaseUnavailable(str(exc), store="postgres") from exc

    async def run(
        self, sql: str, params: Sequence[Any] = (), *, conn: Any = None, write: bool = False
    ) -> Rows:
        """Run one statement; see the module docstring."""
        if conn is None:
            return await self._pooled(lambda own: own.fetch(sql, *params))
        await self._get_pool()  # the tables exist
        try:
            return await conn.fetch(sql, *params)  # type: ignore[no-any-return]
        except Exception as exc:
            from ..stores.postgres.pooled import store_error

            # The transaction's connection died under the handler: a store failure that the
            # middleware answers (503, the key released), told in plain words.
            error = store_error(exc, what="insert", closed=conn.is_closed())
            if isinstance(error, StoreUnavailableError):
                raise error from exc
            raise

    async def aclose(self) -> None:
        """Close the pool."""
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


class Psycopg(_Postgres):
    """PostgreSQL for the WSGI apps through a psycopg pool, opened on first use in each worker
    process (never inherited across gunicorn's fork). ``RawCursor``: the same ``$1``
    placeholders as asyncpg (and as the store's own connections).

    Args:
        url: ``postgresql://...``; ``?schema=NAME`` keeps the tables in that schema.
    """

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self._lock = threading.Lock()

    def _get_pool(self) -> Any:
        with self._lock:
            if self._pool is None:
                self._pool = self._open_pool()
            return self._pool

    def _open_pool(self) -> Any:
        import psycopg
        from psycopg_pool import ConnectionPool

        kwargs: dict[str, Any] = {"autocommit": True, "cursor_factory": psycopg.RawCursor}
        try:
            with psycopg.connect(self._dsn, connect_timeout=10, **kwargs) as conn:
                for statement in self._setup():
                    conn.execute(statement)
            pool = ConnectionPool(
                self._dsn,
                kwargs=kwargs,
                min_size=1,
                max_size=8,
                open=False,
                check=ConnectionPool.check_connection,  # a connection the server closed is replaced
            )
            pool.open(wait=True, timeout=10)
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable(
                f"PostgreSQL connect failed: {exc}", store="postgres"
            ) from exc
        return pool

    def run(
        self, sql: str, params: Sequence[Any] = (), *, conn: Any = None, write: bool = False
    ) -> Rows:
        """Run one statement; see the module docstring."""
        import psycopg

        if conn is not None:
            # The request's transaction connection takes psycopg's own %s; the demo's SQL is $1.
            cursor = psycopg.RawCursor(conn).execute(sql, params)
            return cursor.fetchall() if cursor.description is not None else []
        try:
            with self._get_pool().connection(timeout=10) as own:
                cursor = own.execute(sql, params)
                return cursor.fetchall() if cursor.description is not None else []
        except psycopg.OperationalError as exc:  # the server is gone, or the pool timed out
            raise DatabaseUnavailable(
                f"PostgreSQL statement failed: {exc}", store="postgres"
            ) from exc

    def close(self) -> None:
        """Close the pool."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


class _MySQL:
    """What both MySQL adapters share: the connection settings of a ``mysql://`` URL (the
    store's own options, such as ``table=``, are allowed and ignored)."""

    sql = Statements(mysql=True)

    def __init__(self, url: str) -> None:
        from ..stores.mysql import MySQLOptions

        self._kwargs = MySQLOptions.from_url(url).connect_kwargs()

    @staticmethod
    def _unavailable(exc: BaseException) -> DatabaseUnavailable:
        return DatabaseUnavailable(f"MySQL statement failed: {exc}", store="mysql")


class Asyncmy(_MySQL):
    """MySQL/MariaDB for the async apps through an asyncmy pool (opened on first use)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self._pool: Any = None
        self._lock: asyncio.Lock | None = None

    async def _get_pool(self) -> Any:
        import asyncmy

        if self._pool is None:
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:
                if self._pool is None:
                    pool = await asyncmy.create_pool(minsize=1, maxsize=_POOL_SIZE, **self._kwargs)
                    async with pool.acquire() as conn, conn.cursor() as cur:
                        for statement in _MYSQL_SCHEMA:
                            await cur.execute(statement)
                    self._pool = pool
        return self._pool

    async def _on(self, conn: Any, sql: str, params: Sequence[Any]) -> Rows:
        rows: Rows = []
        async with conn.cursor() as cur:
            for statement in sql.split(MYSQL_THEN):
                await cur.execute(statement, params or None)
                rows = await cur.fetchall() if cur.description else []
                params = ()
        return rows

    async def run(
        self, sql: str, params: Sequence[Any] = (), *, conn: Any = None, write: bool = False
    ) -> Rows:
        """Run one statement; see the module docstring."""
        try:
            pool = await self._get_pool()  # the tables exist
            if conn is not None:
                return await self._on(conn, sql, params)
            async with pool.acquire() as own:
                return await self._on(own, sql, params)
        except (OSError, ConnectionError) as exc:
            raise self._unavailable(exc) from exc

    async def aclose(self) -> None:
        """Close the pool."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
            await pool.wait_closed()


class PyMySQL(_MySQL):
    """MySQL/MariaDB for the WSGI apps: one PyMySQL connection per worker thread."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self._local = threading.local()

    def _conn(self) -> Any:
        import pymysql

        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = pymysql.connect(**self._kwargs)
                with conn.cursor() as cur:
                    for statement in _MYSQL_SCHEMA:
                        cur.execute(statement)
            except pymysql.err.OperationalError as exc:
                raise self._unavailable(exc) from exc
            self._local.conn = conn
        return conn

    def run(
        self, sql: str, params: Sequence[Any] = (), *, conn: Any = None, write: bool = False
    ) -> Rows:
        """Run one statement; see the module docstring."""
        import pymysql

        own = self._conn()  # the tables exist
        rows: Rows = []
        try:
            with (conn or own).cursor() as cur:
                for statement in sql.split(MYSQL_THEN):
                    cur.execute(statement, params or None)
                    rows = cur.fetchall() if cur.description else []
                    params = ()
        except pymysql.err.OperationalError as exc:
            if conn is None:
                self._local.conn = None  # reconnect on the next statement
            raise self._unavailable(exc) from exc
        return rows

    def close(self) -> None:
        """Close this thread's connection."""
        conn, self._local.conn = getattr(self._local, "conn", None), None
        if conn is not None:
            conn.close()


def _dialect(url: str) -> int:
    """Which adapter a ``--db`` URL takes: 0 SQLite, 1 PostgreSQL, 2 MySQL.

    Raises:
        ConfigurationError: none of them.
    """
    for dialect, schemes in enumerate(_SCHEMES):
        if url.startswith(schemes):
            return dialect
    raise ConfigurationError(
        f"OrderHub keeps its data in SQLite (sqlite:///...), PostgreSQL or MySQL, got {url!r}"
    )


#: The URL schemes of each adapter, in :func:`_dialect`'s order.
_SCHEMES = (("sqlite:///",), ("postgresql://", "postgres://"), ("mysql://", "mariadb://"))


def open_async_driver(url: str) -> AsyncSQLite | Asyncpg | Asyncmy:
    """The async adapter for a ``--db`` URL.

    Raises:
        ConfigurationError: not SQLite, PostgreSQL or MySQL, or a bad option.
    """
    return (AsyncSQLite, Asyncpg, Asyncmy)[_dialect(url)](url)


def open_driver(url: str) -> SyncSQLite | Psycopg | PyMySQL:
    """The sync adapter for a ``--db`` URL.

    Raises:
        ConfigurationError: not SQLite, PostgreSQL or MySQL, or a bad option.
    """
    return (SyncSQLite, Psycopg, PyMySQL)[_dialect(url)](url)
