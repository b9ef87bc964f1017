"""Driver-independent half of the PostgreSQL store: options, statements, operations.

Both faces of :mod:`retrysafe.stores.postgres` (asyncpg for async, psycopg for sync) and their
transactional mode run exactly this code; only the few lines that send a statement and read its
rows differ per driver (``_asyncpg.py``, ``_psycopg.py``).

- :class:`PostgresOptions`: everything a ``postgresql://`` URL's query may set, validated once.
- :class:`Statements`: the named statements of ``sql/postgres.sql`` with ``{cfg}`` (the shared
  CTE) and ``{table}`` filled in and the ``:name`` placeholders rewritten to PostgreSQL's own
  ``$1, $2...`` (both asyncpg and psycopg's ``RawCursor`` take those), plus the order in which
  to pass the arguments.
- ``reserve_op`` (one statement, and the owner's advisory lock) and ``ensure_schema_op``:
  PostgreSQL's own operations. The others (``renew_op``, ``complete_op``...) take the same
  steps on MySQL: they are ``stores/_sql_ops.py``'s, with the statement and query types and
  :class:`ConnectionLostError`, and re-exported here. Each is a generator: it yields a
  :class:`Query`, receives its rows, and returns the result. The one action loop
  (:func:`retrysafe._core.drive.drive`) sends the statements through a driver. A connection
  lost in the middle of a statement is thrown into the generator as
  :class:`ConnectionLostError`, so the retry policy is written once for both drivers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, ClassVar

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
    "LIBPQ_OPTIONS",
    "SCHEMES",
    "URL_OPTIONS",
    "PostgresOptions",
    "Statements",
    "ensure_schema_op",
    "is_unavailable_sqlstate",
    "owner_lock_key",
    "owner_lock_query",
    "reserve_op",
]

STORE_NAME = "postgres"
DEFAULT_TABLE = "retrysafe_records"

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_PLACEHOLDER = re.compile(r"(?<![:\w]):([A-Za-z_][A-Za-z0-9_]*)")
_SYNCHRONOUS_COMMIT = {"on", "off", "local", "remote_write", "remote_apply"}

SCHEMES = ("postgresql", "postgres")

#: The store's own query options (see :class:`PostgresOptions`): keyword -> converter.
URL_OPTIONS = {
    "table": text,
    "auto_create": flag,
    "min_size": whole,
    "max_size": whole,
    "connect_timeout": non_negative,
    "pool_timeout": non_negative,
    "max_idle": non_negative,
    "synchronous_commit": text,
    "application_name": text,
}

#: libpq's connection parameters (PostgreSQL 17), left in the URL for the driver; any other
#: query option is refused, so a misspelled store option is never sent to the server as one.
LIBPQ_OPTIONS = frozenset(
    {
        "host",
        "hostaddr",
        "port",
        "dbname",
        "user",
        "password",
        "passfile",
        "require_auth",
        "channel_binding",
        "client_encoding",
        "options",
        "fallback_application_name",
        "keepalives",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
        "tcp_user_timeout",
        "replication",
        "gssencmode",
        "sslmode",
        "requiressl",
        "sslnegotiation",
        "sslcompression",
        "sslcert",
        "sslkey",
        "sslpassword",
        "sslcertmode",
        "sslrootcert",
        "sslcrl",
        "sslcrldir",
        "sslsni",
        "requirepeer",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "krbsrvname",
        "gsslib",
        "gssdelegation",
        "service",
        "target_session_attrs",
        "load_balance_hosts",
    }
)


def is_unavailable_sqlstate(sqlstate: str | None) -> bool:
    """Whether a server error means "not available now, retry later" rather than a bug.

    Class 08 (connection exception), 53 (insufficient resources, e.g. too many connections),
    57P01-57P05 (admin/crash shutdown, cannot connect now, idle session timeout).
    """
    if not sqlstate:
        return False
    return sqlstate.startswith(("08", "53")) or sqlstate in {
        "57P01",
        "57P02",
        "57P03",
        "57P04",
        "57P05",
    }


def quote_table(table: str) -> tuple[str, str, str]:
    """Validate ``table`` or ``schema.table``; return (quoted name, quoted index name, plain).

    Only plain identifiers are accepted (letters, digits, ``_``; at most 63 characters each), so
    the quoted name can be put into SQL text safely.

    Raises:
        ConfigurationError: not one or two identifiers separated by a dot.
    """
    parts, index = table_parts(table, _IDENTIFIER, store="postgres", container="SCHEMA")
    return ".".join(f'"{p}"' for p in parts), f'"{index}"', table


@dataclass(frozen=True, kw_only=True)
class PostgresOptions:
    """Settings of a PostgreSQL store; each can be given as a ``postgresql://`` URL query option.

    Attributes:
        dsn: the connection URL handed to the driver (retrysafe's own options removed).
        table: ``name`` or ``schema.name`` of the records table (the schema must exist).
        auto_create: create the table on first use if it is missing (default true: zero set-up,
            like the SQLite store; it costs one catalog lookup per store, not per request). Set
            false where the application's role may not run DDL, and create the table once with
            ``retrysafe schema apply --store URL``.
        min_size: connections the pool keeps open.
        max_size: most connections the pool opens.
        connect_timeout: seconds to wait for a new connection.
        pool_timeout: seconds to wait for a free pooled connection before failing with
            :class:`~retrysafe.StoreUnavailableError`.
        max_idle: seconds after which an idle pooled connection above ``min_size`` is closed;
            0 keeps them. The async face defaults to 0: asyncpg arms and cancels an inactivity
            timer on every release, about 10 us of CPU per operation measured, while at most
            ``max_size`` idle connections is a small price. The sync face uses psycopg_pool's
            ``max_idle`` (600 s when 0 is given, since it has no "keep" setting).
        synchronous_commit: opt-in ``synchronous_commit`` for the store's own write transactions
            only (e.g. ``off``: a commit no longer waits for its WAL flush, so a server crash can
            lose the last few hundred milliseconds of reservations and completions; a lost
            reservation lets a retry run again). Unset (default): the server's setting.
        application_name: shown in ``pg_stat_activity`` (default ``retrysafe``), to find the
            store's connections.
    """

    dsn: str
    table: str = DEFAULT_TABLE
    auto_create: bool = True
    min_size: int = 1
    max_size: int = 10
    connect_timeout: float = 5.0
    pool_timeout: float = 5.0
    max_idle: float = 0.0
    synchronous_commit: str | None = None
    application_name: str = "retrysafe"
    quoted_table: str = field(init=False, repr=False)
    quoted_index: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        quoted, index, _ = quote_table(self.table)
        object.__setattr__(self, "quoted_table", quoted)
        object.__setattr__(self, "quoted_index", index)
        if self.max_size < 1 or self.min_size > self.max_size:
            raise ConfigurationError(
                f"postgres pool sizes: need 0 <= min_size <= max_size and max_size >= 1 "
                f"(got {self.min_size}, {self.max_size})"
            )
        if self.connect_timeout <= 0 or self.pool_timeout <= 0:
            raise ConfigurationError("postgres connect_timeout and pool_timeout must be > 0")
        if (
            self.synchronous_commit is not None
            and self.synchronous_commit not in _SYNCHRONOUS_COMMIT
        ):
            choices = ", ".join(sorted(_SYNCHRONOUS_COMMIT))
            raise ConfigurationError(
                f"postgres synchronous_commit={self.synchronous_commit!r}: use one of {choices}"
            )

    @classmethod
    def from_url(cls, url: str | StoreURL, **overrides: Any) -> PostgresOptions:
        """Split retrysafe's options off a ``postgresql://`` URL.

        The options of :data:`URL_OPTIONS` are read here; libpq's own (``sslmode``...) stay in
        the URL for the driver; any other is refused.

        Args:
            url: the URL (or the URL already parsed by :func:`retrysafe.stores.parse_store_url`).
            **overrides: options given as keywords (they win over the URL's).

        Raises:
            ConfigurationError: not a postgres URL, an unknown option, or a bad value.
        """
        parsed = store_url(url, SCHEMES, "postgresql://")
        return cls(dsn=parsed.driver_url(), **{**parsed.options, **overrides})


def to_dollar(sql: str) -> tuple[str, tuple[str, ...]]:
    """Rewrite ``:name`` placeholders to ``$1, $2...`` (one number per distinct name).

    ``::type`` casts are left alone, and ``--`` comment lines are dropped so that a colon in a
    comment can never become a parameter.
    """
    lines = [line for line in sql.splitlines() if not line.lstrip().startswith("--")]
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return _PLACEHOLDER.sub(number, "\n".join(lines)), tuple(names)


class Statements:
    """The statements of ``sql/postgres.sql`` prepared for one table.

    Args:
        options: the store's options (table name, synchronous_commit).
    """

    #: :func:`reserve_op`, set below it: the SQL stores' facade calls the reservation as a
    #: method of the statements (``q.reserve(...)`` is ``reserve_op(q, ...)``), which costs it
    #: what calling the module's function cost when each dialect had its own facade.
    reserve: ClassVar[Callable[..., Generator[Query, Rows, Reservation]]]

    def __init__(self, options: PostgresOptions) -> None:
        self.options = options
        self.synchronous_commit = options.synchronous_commit
        self.table_name = options.table
        self._by_name: dict[str, Statement] = {}
        queries = dict(load_queries("retrysafe.stores.postgres", "postgres.sql"))
        cfg = queries.pop("cfg")  # a fragment of the write statements, not one itself
        for name, source in queries.items():
            source = source.replace("{cfg}", cfg)
            source = source.replace("{table}", options.quoted_table)
            source = source.replace("{index}", options.quoted_index)
            sql, params = to_dollar(source)
            self._by_name[name] = Statement(name, sql, params)

    def __getitem__(self, name: str) -> Statement:
        return self._by_name[name]

    def query(self, name: str, **values: Any) -> Query:
        """A statement with its arguments (``synchronous_commit`` is filled in here)."""
        statement = self._by_name[name]
        if "synchronous_commit" in statement.params:
            values["synchronous_commit"] = self.synchronous_commit
        return Query(statement, statement.args(values))


#: The first key of every owner lock (two-int advisory locks never collide with bigint ones):
#: "rsaf", so the owner locks are easy to tell apart in pg_locks.
OWNER_LOCK_CLASS = 0x72736166


def owner_lock_key(instance: str) -> int:
    """The second key of the owner lock of ``instance``: 32 bits of its (random) id.

    Two live processes sharing a key only makes a dead one look alive (its key waits for the
    lease), never the reverse.
    """
    value = int(instance[:8], 16)
    return value - (1 << 32) if value >= 1 << 31 else value


def owner_lock_query(q: Statements, instance: str) -> Query:
    """The statement that takes the owner lock of ``instance`` (on its own session)."""
    return q.query("owner_lock", owner_class=OWNER_LOCK_CLASS, owner_key=owner_lock_key(instance))


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

    Runs the one-statement reserve-or-read; on no row (a concurrent commit after the snapshot,
    or a release between snapshot and insert) runs it again. After a lost connection it runs it
    again too: the statement recognises this call's token if the lost attempt had won.

    When the key is held by another process's in-progress reservation, one more statement asks
    whether that process is alive (its owner lock) and takes the record over if it is not.

    Args:
        q: the statements.
        record_id: the record.
        fingerprint: the request's fingerprint.
        lease: seconds of lease.
        ttl: seconds of retention.
        owned: this process holds its owner lock, so its token may name it as owner.
    """
    token = lease_token(owned)
    query = q.query(
        "reserve",
        id=record_id,
        fingerprint=fingerprint,
        token=token,
        lease=float(lease),
        ttl=float(ttl),
    )
    lost = False
    for _ in range(RESERVE_ATTEMPTS):
        try:
            rows = yield query
        except ConnectionLostError:
            if lost:
                raise
            lost = True
            continue
        if not rows:
            continue
        row = rows[0]
        if row[0]:
            return Reservation(token=token)
        record = record_from(row, 1)
        holder = row[5] if len(row) > 5 else None
        owner = other_owner(holder)
        if record.state != "in_progress" or owner is None:
            return Reservation(record=record)
        taken = yield from retry_once(
            q.query(
                "take_over",
                owner_class=OWNER_LOCK_CLASS,
                owner_key=owner_lock_key(owner),
                id=record_id,
                holder=holder,
                fingerprint=fingerprint,
                token=token,
                lease=float(lease),
                ttl=float(ttl),
            )
        )
        dead, took = taken[0]
        if took:
            return Reservation(token=token)
        if not dead:
            return Reservation(record=record)
        if record.committed:
            # Effects happened and no one will store the answer: outcome unknown at once.
            return Reservation(record=Record(record.fingerprint, "in_progress", committed=True))
        # The owner is dead but the record changed in between: read it again.
    raise StoreError(
        f"reserve found no record {RESERVE_ATTEMPTS} times in a row (constant churn on one key)",
        store=STORE_NAME,
    )


def ensure_schema_op(q: Statements, *, only_if_missing: bool) -> Generator[Query, Rows, None]:
    """Create the table and its expiry index. Run inside one transaction.

    Args:
        q: the statements.
        only_if_missing: look the table up first and stop if it exists (first use: a role
            without CREATE rights can still use an existing table).
    """
    if only_if_missing:
        rows = yield q.query("table_exists", table_name=q.options.quoted_table)
        if rows and rows[0][0]:
            return
    yield q.query("lock_schema", table_name=q.table_name)
    yield q.query("create_table")
    yield q.query("create_index")


Statements.reserve = reserve_op

#: What the SQL stores' facade (``stores/_sql_async.py``, ``_sql_sync.py``) takes from this
#: dialect, for both faces.
DIALECT = Dialect(options=PostgresOptions, statements=Statements)
