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
from typing import Any, TypeVar
from urllib.parse import parse_qs

from .._core.errors import ConfigurationError, StoreUnavailableError
from ..stores.sqlite import (
    DEFAULT_BUSY_TIMEOUT,
    SQLiteBusyError,
    busy_timeout_option,
    file_key,
    parse_sqlite_url,
    retry_while_busy,
)
from .domain import DatabaseUnavailable, Kind

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
CREATE TABLE IF NOT EXISTS orderhub_charges (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    payment_id INTEGER NOT NULL,
    flow TEXT NOT NULL,
    amount INTEGER NOT NULL,
    currency TEXT NOT NULL,
    task_id TEXT NOT NULL,
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE TABLE IF NOT EXISTS orderhub_charge_runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    payment_id INTEGER NOT NULL,
    flow TEXT NOT NULL,
    task_id TEXT NOT NULL,
    pid INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    started_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
"""

_POSTGRES_SCHEMA = """
CREATE TABLE IF NOT EXISTS {prefix}orderhub_orders (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner TEXT NOT NULL,
    item TEXT NOT NULL,
    quantity BIGINT NOT NULL,
    created_at TEXT NOT NULL
        DEFAULT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
);
CREATE TABLE IF NOT EXISTS {prefix}orderhub_payments (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner TEXT NOT NULL,
    amount BIGINT NOT NULL,
    currency TEXT NOT NULL,
    created_at TEXT NOT NULL
        DEFAULT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
);
CREATE TABLE IF NOT EXISTS {prefix}orderhub_charges (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payment_id BIGINT NOT NULL,
    flow TEXT NOT NULL,
    amount BIGINT NOT NULL,
    currency TEXT NOT NULL,
    task_id TEXT NOT NULL,
    created_at TEXT NOT NULL
        DEFAULT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
);
CREATE TABLE IF NOT EXISTS {prefix}orderhub_charge_runs (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payment_id BIGINT NOT NULL,
    flow TEXT NOT NULL,
    task_id TEXT NOT NULL,
    pid BIGINT NOT NULL,
    outcome TEXT NOT NULL,
    started_at TEXT NOT NULL
        DEFAULT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
);
"""

_MYSQL_SCHEMA = [
    f"CREATE TABLE IF NOT EXISTS orderhub_{name} (id BIGINT AUTO_INCREMENT PRIMARY KEY, "
    f"{columns}, {stamp} VARCHAR(32) NOT NULL DEFAULT '') ENGINE = InnoDB"
    for name, columns, stamp in (
        ("orders", "owner TEXT NOT NULL, item TEXT NOT NULL, quantity BIGINT NOT NULL",
         "created_at"),
        ("payments", "owner TEXT NOT NULL, amount BIGINT NOT NULL, currency TEXT NOT NULL",
         "created_at"),
        ("charges", "payment_id BIGINT NOT NULL, flow TEXT NOT NULL, amount BIGINT NOT NULL, "
         "currency TEXT NOT NULL, task_id TEXT NOT NULL", "created_at"),
        ("charge_runs", "payment_id BIGINT NOT NULL, flow TEXT NOT NULL, task_id TEXT NOT NULL, "
         "pid BIGINT NOT NULL, outcome TEXT NOT NULL", "started_at"),
    )
]  # fmt: skip
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
        names = ("owner", *kind.fields)
        marks = ", ".join(self._mark(i + 1) for i in range(len(names)))
        if self.mysql:
            stamp = "started_at" if "started_at" in kind.columns else "created_at"
            return (
                f"INSERT INTO {self._table(kind)} ({', '.join(names)}, {stamp}) "
                f"VALUES ({marks}, {_MYSQL_NOW})"
                f"{MYSQL_THEN}{self._select(kind)} WHERE id = LAST_INSERT_ID()"
            )
        return (
            f"INSERT INTO {self._table(kind)} ({', '.join(names)}) VALUES ({marks}) "
            f"RETURNING {', '.join(kind.columns)}"
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
            conn.executescript(_SQLITE_SCHEMA)
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
        return [*schema, "BEGIN", lock, _POSTGRES_SCHEMA.format(prefix=self.sql.prefix), "COMMIT"]


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
            from ..stores.postgres._asyncpg import _asyncpg_error

            # The transaction's connection died under the handler: a store failure that the
            # middleware answers (503, the key released), told in plain words.
            error = _asyncpg_error(exc, established=False, what="insert", closed=conn.is_closed())
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
            cursor = conn.execute(sql, params)
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


def _check_scheme(url: str) -> None:
    if not url.startswith(("sqlite:///", "postgresql://", "postgres://", "mysql://", "mariadb://")):
        raise ConfigurationError(
            f"OrderHub keeps its data in SQLite (sqlite:///...), PostgreSQL or MySQL, got {url!r}"
        )


def open_async_driver(url: str) -> AsyncSQLite | Asyncpg | Asyncmy:
    """The async adapter for a ``--db`` URL.

    Raises:
        ConfigurationError: not SQLite, PostgreSQL or MySQL, or a bad option.
    """
    _check_scheme(url)
    if url.startswith(("mysql://", "mariadb://")):
        return Asyncmy(url)
    return AsyncSQLite(url) if url.startswith("sqlite:///") else Asyncpg(url)


def open_driver(url: str) -> SyncSQLite | Psycopg | PyMySQL:
    """The sync adapter for a ``--db`` URL.

    Raises:
        ConfigurationError: not SQLite, PostgreSQL or MySQL, or a bad option.
    """
    _check_scheme(url)
    if url.startswith(("mysql://", "mariadb://")):
        return PyMySQL(url)
    return SyncSQLite(url) if url.startswith("sqlite:///") else Psycopg(url)
