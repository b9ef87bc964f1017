"""Driver-independent half of the MySQL/MariaDB store: options, statements, operations.

Both faces of :mod:`retrysafe.stores.mysql` (asyncmy for async, PyMySQL for sync) and their
transactional mode run exactly this code; only the few lines that send a statement and read its
rows differ per driver (``_asyncmy.py``, ``_pymysql.py``).

- :class:`MySQLOptions`: everything a ``mysql://`` URL's query may set, validated once.
- :class:`Statements`: the named statements of ``mysql.sql`` with ``{now}``, ``{table}`` and
  ``{index}`` filled in and the ``:name`` placeholders rewritten to the drivers' ``%s``.
- ``reserve_op`` (an insert, then a read with the owner's named lock) and
  ``ensure_schema_op``: MySQL's own operations. The others (``renew_op``, ``complete_op``...)
  take the same steps on PostgreSQL: they are ``stores/_sql_ops.py``'s, with the statement and
  query types and :class:`ConnectionLostError`, and re-exported here. Each is a generator: it
  yields a :class:`Query`, receives its rows (a write answers no rows when it changed none,
  else one row holding its affected-row count), and returns the result; the one action loop
  (:func:`retrysafe._core.drive.drive`) sends the statements through a driver. A connection
  lost in the middle of a statement is thrown into the generator as
  :class:`ConnectionLostError`, a deadlock or lock wait timeout as :class:`RetryableError`, so
  the retry policy is written once for both drivers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import unquote

from ..._core.errors import ConfigurationError, StoreError
from ..._core.records import Record, Reservation, lease_token, other_owner
from .._sql import load_queries
from .._sql_ops import (
    RESERVE_ATTEMPTS,
    ConnectionLostError,
    Dialect,
    Query,
    Rows,
    Statement,
    record_from,
    retry_once,
    store_url,
    table_parts,
)
from .._url import StoreURL, flag, non_negative, text, whole

__all__ = [
    "DIALECT",
    "OWNER_LOCK_PREFIX",
    "SCHEMES",
    "URL_OPTIONS",
    "MySQLOptions",
    "RetryableError",
    "Statements",
    "ensure_schema_op",
    "error_kind",
    "owner_lock_query",
    "reserve_op",
]

STORE_NAME = "mysql"
DEFAULT_TABLE = "retrysafe_records"
#: The named lock of an instance is this prefix and its 24-character id (64 characters at most).
OWNER_LOCK_PREFIX = "retrysafe:"

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,63}")
_PLACEHOLDER = re.compile(r"(?<![:\w]):([A-Za-z_][A-Za-z0-9_]*)")

SCHEMES = ("mysql", "mariadb")

#: The store's own query options (see :class:`MySQLOptions`): keyword -> converter.
URL_OPTIONS = {
    "table": text,
    "auto_create": flag,
    "max_size": whole,
    "connect_timeout": non_negative,
    "pool_timeout": non_negative,
    "read_timeout": non_negative,
    "charset": text,
    "ssl": flag,
    "ssl_ca": text,
    "unix_socket": text,
}

#: Server error codes that mean "the connection is gone" (the statement may or may not have
#: run): server gone away, lost connection, shutdown in progress, connection killed (MariaDB),
#: disconnected for inactivity (MySQL 8.0.24+), lost during read (MySQL 8).
LOST_CODES = frozenset({2006, 2013, 2055, 1053, 1927, 4031, 1160, 1161})
#: "Not available now": can't connect, unknown host, too many connections, out of memory.
UNAVAILABLE_CODES = frozenset({2002, 2003, 2005, 1040, 1041, 1203, 1226})
#: The statement was rolled back and did nothing: deadlock, lock wait timeout.
RETRYABLE_CODES = frozenset({1213, 1205})


class RetryableError(ConnectionLostError):
    """InnoDB rolled the statement back (a deadlock with a concurrent writer, a lock wait
    timeout): it did nothing, and running it again is what the server asks for."""


def error_kind(code: int | None) -> str:
    """``"lost"``, ``"unavailable"``, ``"retry"`` or ``"error"`` for a MySQL error code."""
    if code in LOST_CODES:
        return "lost"
    if code in UNAVAILABLE_CODES:
        return "unavailable"
    if code in RETRYABLE_CODES:
        return "retry"
    return "error"


def quote_table(table: str) -> tuple[str, str, str | None, str]:
    """Validate ``table`` or ``database.table``; return (quoted name, quoted index name,
    database or ``None``, bare table name).

    Raises:
        ConfigurationError: not one or two identifiers separated by a dot.
    """
    parts, index = table_parts(table, _IDENTIFIER, store="mysql", container="DATABASE")
    schema = parts[0] if len(parts) == 2 else None
    return ".".join(f"`{p}`" for p in parts), f"`{index}`", schema, parts[-1]


@dataclass(frozen=True, kw_only=True)
class MySQLOptions:
    """Settings of a MySQL/MariaDB store; each can be given as a ``mysql://`` URL query option.

    Attributes:
        host: the server's host (default ``127.0.0.1``).
        port: its port (default 3306).
        user: the user (default ``root``).
        password: the password (default none).
        database: the database (the URL's path); required.
        table: ``name`` or ``database.name`` of the records table.
        auto_create: create the table on first use if it is missing (default true; one catalog
            lookup per store). Set false where the application's user may not run DDL, and
            create the table once with ``retrysafe schema apply --store URL``.
        max_size: most connections the pool opens (per process and face).
        connect_timeout: seconds to wait for a new connection.
        pool_timeout: seconds to wait for a free pooled connection before failing with
            :class:`~retrysafe.StoreUnavailableError`.
        read_timeout: seconds to wait for a statement's answer (0: no limit; the sync face
            only, PyMySQL's ``read_timeout``).
        charset: the connection's character set (default ``utf8mb4``).
        ssl: use TLS with the system's certificate authorities.
        ssl_ca: a CA bundle file for TLS (implies ``ssl``).
        unix_socket: connect through this socket file instead of TCP.
    """

    database: str
    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "root"
    password: str = ""
    table: str = DEFAULT_TABLE
    auto_create: bool = True
    max_size: int = 10
    connect_timeout: float = 5.0
    pool_timeout: float = 5.0
    read_timeout: float = 0.0
    charset: str = "utf8mb4"
    ssl: bool = False
    ssl_ca: str | None = None
    unix_socket: str | None = None
    quoted_table: str = field(init=False, repr=False)
    quoted_index: str = field(init=False, repr=False)
    schema_name: str | None = field(init=False, repr=False)
    table_name: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        quoted, index, schema, name = quote_table(self.table)
        object.__setattr__(self, "quoted_table", quoted)
        object.__setattr__(self, "quoted_index", index)
        object.__setattr__(self, "schema_name", schema)
        object.__setattr__(self, "table_name", name)
        if not self.database:
            raise ConfigurationError("mysql store URL needs a database: mysql://user@host/DB")
        if self.max_size < 1:
            raise ConfigurationError(f"mysql max_size must be >= 1 (got {self.max_size})")
        if self.connect_timeout <= 0 or self.pool_timeout <= 0:
            raise ConfigurationError("mysql connect_timeout and pool_timeout must be > 0")

    @classmethod
    def from_url(cls, url: str | StoreURL, **overrides: Any) -> MySQLOptions:
        """Read a ``mysql://user:password@host:port/database?option=value`` URL.

        Args:
            url: the URL (or the URL already parsed by :func:`retrysafe.stores.parse_store_url`).
            **overrides: options given as keywords (they win over the URL's).

        Raises:
            ConfigurationError: not a mysql URL, an unknown option, or a bad value.
        """
        parsed = store_url(url, SCHEMES, "mysql://")
        if len(parsed.hosts) > 1:
            raise ConfigurationError("a mysql:// URL names one host")
        host, port = parsed.hosts[0] if parsed.hosts else ("127.0.0.1", None)
        values: dict[str, Any] = {
            "host": host or "127.0.0.1",
            "port": port or 3306,
            "database": unquote(parsed.path.strip("/")),
        }
        if parsed.username is not None:
            values["user"] = parsed.username
        if parsed.password is not None:
            values["password"] = parsed.password
        return cls(**{**values, **parsed.options, **overrides})

    def connect_kwargs(self, *, timeouts: bool = False) -> dict[str, Any]:
        """The keyword arguments PyMySQL's and asyncmy's ``connect`` share; with ``timeouts``,
        also PyMySQL's ``read_timeout`` and ``write_timeout`` (``read_timeout``)."""
        kwargs: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "database": self.database,
            "charset": self.charset,
            "autocommit": True,
            "connect_timeout": self.connect_timeout,
        }
        if self.unix_socket:
            kwargs["unix_socket"] = self.unix_socket
        if self.ssl or self.ssl_ca:
            import ssl

            kwargs["ssl"] = ssl.create_default_context(cafile=self.ssl_ca)
        if timeouts and self.read_timeout:
            kwargs["read_timeout"] = self.read_timeout
            kwargs["write_timeout"] = self.read_timeout
        return kwargs


def to_format(sql: str) -> tuple[str, tuple[str, ...]]:
    """Rewrite ``:name`` placeholders to ``%s`` (a name used twice is passed twice), escape
    any other ``%`` and drop ``--`` comment lines."""
    lines = [line for line in sql.splitlines() if not line.lstrip().startswith("--")]
    names: list[str] = []

    def mark(match: re.Match[str]) -> str:
        names.append(match.group(1))
        return "%s"

    body = "\n".join(lines).replace("%", "%%")
    return _PLACEHOLDER.sub(mark, body), tuple(names)


class Statements:
    """The statements of ``mysql.sql`` prepared for one table.

    Args:
        options: the store's options (table name).
    """

    #: :func:`reserve_op`, set below it: the SQL stores' facade calls the reservation as a
    #: method of the statements (``q.reserve(...)`` is ``reserve_op(q, ...)``), which costs it
    #: what calling the module's function cost when each dialect had its own facade.
    reserve: ClassVar[Callable[..., Generator[Query, Rows, Reservation]]]

    def __init__(self, options: MySQLOptions) -> None:
        self.options = options
        self._by_name: dict[str, Statement] = {}
        queries = dict(load_queries("retrysafe.stores.mysql", "mysql.sql"))
        now = queries.pop("now")  # a fragment of the statements, not one itself
        for name, source in queries.items():
            source = source.replace("{now}", now)
            source = source.replace("{table}", options.quoted_table)
            source = source.replace("{index}", options.quoted_index)
            sql, params = to_format(source)
            returns_rows = sql.lstrip().upper().startswith("SELECT")
            self._by_name[name] = Statement(name, sql, params, returns_rows)

    def __getitem__(self, name: str) -> Statement:
        return self._by_name[name]

    def query(self, name: str, **values: Any) -> Query:
        """A statement with its arguments."""
        statement = self._by_name[name]
        return Query(statement, statement.args(values))


def owner_lock_query(q: Statements, instance: str) -> Query:
    """The statement that takes the owner lock of ``instance`` (on its own session)."""
    return q.query("owner_lock", lock_name=OWNER_LOCK_PREFIX + instance)


def reserve_op(
    q: Statements,
    record_id: str,
    fingerprint: str,
    *,
    lease: float,
    ttl: float,
    owned: bool = False,
) -> Generator[Query, Rows, Reservation]:
    """See :meth:`retrysafe.stores.AsyncStore.reserve`.

    Inserts (or takes over an expired or lapsed record) in one statement; when a live record is
    there, reads it (``peek``) with whether its owner is gone. An owner that is gone has its
    in-progress record taken over at once (fenced on its token); its committed record is
    "outcome unknown" at once. After a lost connection or a deadlock the insert runs again: it
    recognises this call's own token if the lost attempt had won.

    Args:
        q: the statements.
        record_id: the record.
        fingerprint: the request's fingerprint.
        lease: seconds of lease.
        ttl: seconds of retention.
        owned: this process holds its owner lock, so its token may name it as owner.
    """
    token = lease_token(owned)
    values = {
        "id": record_id,
        "fingerprint": fingerprint,
        "token": token,
        "lease": float(lease),
        "ttl": float(ttl),
    }
    insert = q.query("reserve", **values)
    peek = q.query("peek", id=record_id, lock_prefix=OWNER_LOCK_PREFIX)
    lost = False
    for _ in range(RESERVE_ATTEMPTS):
        try:
            if (yield insert):
                return Reservation(token=token)
            rows = yield peek
        except RetryableError:
            continue
        except ConnectionLostError:
            if lost:
                raise
            lost = True
            continue
        if not rows:
            continue  # released or expired since the insert: try again
        row = rows[0]
        holder = row[4]
        if holder == token and row[1] == 0:
            return Reservation(token=token)  # the insert won before a lost connection
        record = record_from(row)
        if record.state == "in_progress" and not record.committed and record.lease_remaining <= 0:
            continue  # lapsed since the insert: the next insert takes it over
        owner = other_owner(holder)
        if record.state != "in_progress" or owner is None or not row[5]:
            return Reservation(record=record)
        if record.committed:
            # Effects happened and no one will store the answer: outcome unknown at once.
            return Reservation(record=Record(record.fingerprint, "in_progress", committed=True))
        if (yield from retry_once(q.query("take_over", holder=holder, **values))):
            return Reservation(token=token)
        # The record changed in between: read it again.
    raise StoreError(
        f"reserve found no record {RESERVE_ATTEMPTS} times in a row (constant churn on one key)",
        store=STORE_NAME,
    )


def ensure_schema_op(q: Statements, *, only_if_missing: bool) -> Generator[Query, Rows, None]:
    """Create the table and its expiry index (one statement: MySQL's DDL commits by itself, and
    ``IF NOT EXISTS`` lets many processes run it at once).

    Args:
        q: the statements.
        only_if_missing: look the table up first and stop if it exists (first use: a user
            without CREATE rights can still use an existing table).
    """
    if only_if_missing:
        o = q.options
        rows = yield q.query("table_exists", schema_name=o.schema_name, table_name=o.table_name)
        if rows and rows[0][0]:
            return
    yield q.query("create_table")


Statements.reserve = reserve_op

#: What the SQL stores' facade (``stores/_sql_async.py``, ``_sql_sync.py``) takes from this
#: dialect, for both faces.
DIALECT = Dialect(options=MySQLOptions, statements=Statements)
