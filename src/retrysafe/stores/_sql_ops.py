"""What the server SQL stores (PostgreSQL, MySQL/MariaDB) share below their facade: the shape of
a statement and of a query, the lost-connection error, and the operations that take the same
steps in both dialects.

An operation (``renew_op``, ``complete_op``...) is a generator: it yields a :class:`Query`
built from the dialect's statements (each backend's ``_sql.py``: its ``.sql`` file, its
placeholders, its options), receives the statement's rows and returns the result; the one
action loop (:func:`retrysafe._core.drive.drive`) sends the statements through the dialect's
driver. A connection lost in the middle of a statement is thrown into the generator as
:class:`ConnectionLostError`, so the retry policy is written once, here, for both dialects and
all four drivers.

The rows a driver answers with: a statement's result rows; a write that changed nothing answers
none, one that changed rows at least one (PostgreSQL's ``RETURNING``; MySQL has none, so its
drivers answer one row holding the affected-row count). ``bool(rows)`` is whether it took
effect, in both dialects. What differs stays in the backend: its reservation (one statement
and an advisory lock on PostgreSQL, an insert, a read and a named lock on MySQL) and its schema
set-up.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from .._core.errors import ConfigurationError, StoreUnavailableError
from .._core.records import Record
from ._registry import Backend, lazy_classes, parse_store_url, register_backend
from ._url import Option, StoreURL

__all__ = [
    "PURGE_BATCH",
    "RESERVE_ATTEMPTS",
    "ConnectionLostError",
    "Dialect",
    "Op",
    "Query",
    "Rows",
    "Statement",
    "StatementSet",
    "complete_op",
    "delete_op",
    "get_op",
    "mark_committed_op",
    "purge_op",
    "record_from",
    "register_sql_package",
    "release_op",
    "renew_op",
    "retry_once",
    "stats_op",
    "store_url",
    "table_parts",
]

T = TypeVar("T")

PURGE_BATCH = 1000
#: A reservation that neither wins nor finds a live record (a concurrent commit after the
#: statement's snapshot, a record released or taken over between two statements) runs again;
#: many times in a row means something else is wrong (constant churn on one key).
RESERVE_ATTEMPTS = 50


class ConnectionLostError(StoreUnavailableError):
    """An established connection broke during a statement (a terminated backend or killed
    session, a server restart).

    The statement may or may not have been carried out; operations decide whether repeating it
    on a fresh connection is safe.
    """


@dataclass(frozen=True, slots=True)
class Statement:
    """One SQL statement in the driver's placeholder style, the parameter names in the order
    the driver takes them, and whether it answers with rows (a ``SELECT``, or PostgreSQL's
    ``RETURNING``) or, on MySQL, with its affected-row count."""

    name: str
    sql: str
    params: tuple[str, ...]
    returns_rows: bool = True

    def args(self, values: Mapping[str, Any]) -> tuple[Any, ...]:
        """The positional arguments for ``values`` given by name."""
        return tuple(values[p] for p in self.params)


@dataclass(frozen=True, slots=True)
class Query:
    """A statement ready to send: what an operation yields to its driver."""

    statement: Statement
    args: tuple[Any, ...]


Rows = Sequence[Sequence[Any]]
#: An operation: yields queries, receives their rows, returns its result.
Op = Generator[Query, Rows, T]


class StatementSet(Protocol):
    """A dialect's statements (its ``_sql.Statements``), as the shared operations use them."""

    def query(self, name: str, **values: Any) -> Query:
        """The statement ``name`` with its arguments."""
        ...


@dataclass(frozen=True, slots=True)
class Dialect:
    """What the SQL stores' facade (``_sql_async.py`` and its sync twin) takes from a backend's
    ``_sql.py``, for both faces.

    Attributes:
        options: the options class (``from_url(url, **options)`` builds one).
        statements: builds the statements for an options instance. They carry the dialect's
            reservation (the one operation whose steps differ between the dialects) as their
            ``reserve(record_id, fingerprint, *, lease, ttl, owned)``.
    """

    options: Any
    statements: Callable[[Any], StatementSet]


def store_url(url: str | StoreURL, schemes: tuple[str, ...], label: str) -> StoreURL:
    """``url`` parsed (unless :func:`retrysafe.stores.parse_store_url` already did), with one of
    the ``schemes`` of the store whose URLs are written ``label`` (``"mysql://"``).

    Raises:
        ConfigurationError: another scheme, or a query option of no store.
    """
    parsed = parse_store_url(url) if isinstance(url, str) else url
    if parsed.scheme not in schemes:
        raise ConfigurationError(f"not a {label} URL: {parsed.scheme}://...")
    return parsed


def table_parts(
    table: str, identifier: re.Pattern[str], *, store: str, container: str
) -> tuple[list[str], str]:
    """``table`` (``NAME`` or ``<container>.NAME``) split at its dot, and the name of its expiry
    index. Each part must match ``identifier`` (the dialect's plain identifiers), so its quoted
    form can be put into SQL text safely.

    Raises:
        ConfigurationError: not one or two identifiers separated by a dot.
    """
    parts = table.split(".")
    if not 1 <= len(parts) <= 2 or not all(identifier.fullmatch(p) for p in parts):
        raise ConfigurationError(
            f"{store} table {table!r}: use NAME or {container}.NAME made of letters, digits and _"
        )
    return parts, f"{parts[-1][:52]}_expires_at"


def register_sql_package(
    package: str,
    name: str,
    prefix: str,
    schemes: tuple[str, ...],
    options: Mapping[str, Option],
    passed: frozenset[str] = frozenset(),
) -> tuple[Backend, Callable[[str], Any]]:
    """Register the server SQL store package ``package`` (``retrysafe.stores.<name>``, its extra
    of the same name): its faces are ``_sync`` (``<prefix>Store``, ``<prefix>Transaction``) and
    ``_async`` (the same names with ``Async`` before them), imported with their driver on first
    use, never by the registration.

    Returns:
        The backend, and the package's module ``__getattr__`` that loads its classes.
    """
    backend = Backend(
        name=name,
        schemes=schemes,
        store=f"{package}._sync:{prefix}Store",
        async_store=f"{package}._async:Async{prefix}Store",
        options=options,
        passed=passed,
        extra=name,
    )
    register_backend(backend)
    faces = {"": "_sync", "Async": "_async"}
    classes = {
        f"{a}{prefix}{kind}": m for a, m in faces.items() for kind in ("Store", "Transaction")
    }
    return backend, lazy_classes(package, classes)


def record_from(row: Sequence[Any], offset: int = 0) -> Record:
    """The record of a ``(fingerprint, state, lease_remaining, response)`` row (from
    ``offset``): state 0 in progress, 1 completed, 2 in progress with its effects committed;
    the lease remaining is the server's seconds."""
    fingerprint, state, lease_remaining, response = row[offset : offset + 4]
    if state == 1:
        return Record(fingerprint, "completed", bytes(response))
    return Record(
        fingerprint,
        "in_progress",
        lease_remaining=max(0.0, float(lease_remaining)),
        committed=state == 2,
    )


def retry_once(query: Query) -> Generator[Query, Rows, Rows]:
    """Run ``query``; after a lost connection (or, on MySQL, a deadlock) run it once more
    (safe for idempotent statements)."""
    try:
        return (yield query)
    except ConnectionLostError:
        return (yield query)


def renew_op(
    q: StatementSet, record_id: str, token: str, *, lease: float
) -> Generator[Query, Rows, bool]:
    """See :meth:`retrysafe.stores.AsyncStore.renew` (extending a lease twice is harmless)."""
    rows = yield from retry_once(q.query("renew", id=record_id, token=token, lease=float(lease)))
    return bool(rows)


def mark_committed_op(
    q: StatementSet, record_id: str, token: str, *, lease: float
) -> Generator[Query, Rows, bool]:
    """See :meth:`retrysafe.stores.AsyncStore.mark_committed` (repeating it is harmless)."""
    query = q.query("mark_committed", id=record_id, token=token, lease=float(lease))
    rows = yield from retry_once(query)
    return bool(rows)


def delete_op(q: StatementSet, record_id: str) -> Generator[Query, Rows, bool]:
    """See :meth:`retrysafe.stores.AsyncStore.delete`."""
    rows = yield from retry_once(q.query("delete", id=record_id))
    return bool(rows)


def complete_op(
    q: StatementSet, record_id: str, token: str, response: bytes, *, ttl: float
) -> Generator[Query, Rows, bool]:
    """See :meth:`retrysafe.stores.AsyncStore.complete`.

    Losing the connection here is the worst moment (the handler ran; a lost completion lets the
    key be run again after the lease), so it is retried on a fresh connection; if the lost
    attempt had committed, ``completed_by`` recognises it as this token's completion.
    """
    query = q.query("complete", id=record_id, token=token, response=response, ttl=float(ttl))
    try:
        rows = yield query
    except ConnectionLostError:
        rows = yield query
        if not rows:
            rows = yield q.query("completed_by", id=record_id, token=token)
    return bool(rows)


def release_op(q: StatementSet, record_id: str, token: str) -> Generator[Query, Rows, bool]:
    """See :meth:`retrysafe.stores.AsyncStore.release`.

    Retried once after a lost connection; it then answers ``False`` if the lost attempt had
    already deleted the record (callers only log that answer).
    """
    rows = yield from retry_once(q.query("release", id=record_id, token=token))
    return bool(rows)


def get_op(q: StatementSet, record_id: str) -> Generator[Query, Rows, Record | None]:
    """See :meth:`retrysafe.stores.AsyncStore.get`."""
    rows = yield from retry_once(q.query("get", id=record_id))
    return record_from(rows[0]) if rows else None


def purge_op(q: StatementSet, batch: int = PURGE_BATCH) -> Generator[Query, Rows, int]:
    """See :meth:`retrysafe.stores.AsyncStore.purge_expired`: batches until one comes back short.

    Each batch is its own short transaction, so a large purge never holds many row locks.
    """
    total = 0
    while True:
        rows = yield from retry_once(q.query("purge", batch=batch))
        deleted = int(rows[0][0]) if rows else 0
        total += deleted
        if deleted < batch:
            return total


def stats_op(q: StatementSet) -> Generator[Query, Rows, Sequence[Any]]:
    """The ``stats`` row (see :class:`~retrysafe.stores.StoreStats`): one read, on the server's
    clock, run again once after a lost connection."""
    rows = yield from retry_once(q.query("stats"))
    return rows[0]
