"""The operation journal: keys that survive a client crash.

``journal.operation("checkout-42")`` binds a key to a caller-chosen operation id and writes it
durably *before* anything is sent. A process that dies mid-call and runs again with the same id
gets the same key back, so the server replays its stored answer instead of running the operation
a second time. Inside ``with journal.operation(...)`` every POST/PATCH sent through a retrying
transport or adapter carries that key.

:class:`SQLiteJournal` is the default (a small file, safe across processes); anything with the
:class:`Journal` methods can stand in (a table in the application's own database, say).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from .._core.errors import ConfigurationError

__all__ = [
    "Journal",
    "JournalEntry",
    "Operation",
    "SQLiteJournal",
    "current_operation",
]

_MAX_OPERATION_ID = 512
_current: contextvars.ContextVar[Operation | None] = contextvars.ContextVar(
    "retrysafe_client_operation", default=None
)


def current_operation() -> Operation | None:
    """Return the operation whose ``with`` block is running in this context, if any."""
    return _current.get()


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One journal row.

    Attributes:
        operation_id: the caller's id.
        key: the Idempotency-Key bound to it.
        created_at: Unix seconds when it was first claimed.
        finished_at: Unix seconds of the server's final answer (``None``: not yet).
        status: that answer's status.
    """

    operation_id: str
    key: str
    created_at: float
    finished_at: float | None = None
    status: int | None = None


@runtime_checkable
class Journal(Protocol):
    """Where operation keys live. Implement these two methods to keep them elsewhere (a table in
    the application's database, a key-value store), then ``Operation.open(journal, id)``."""

    def claim(self, operation_id: str, key: str) -> str:
        """Bind ``key`` to ``operation_id`` unless a key is bound already; durable on return.

        Args:
            operation_id: the caller's operation id.
            key: a fresh key, used only if the operation has none yet.

        Returns:
            The key bound to the operation (the earlier one if there is one).
        """
        ...

    def finish(self, operation_id: str, status: int) -> None:
        """Record that the server gave its final answer for the operation.

        Args:
            operation_id: the operation.
            status: the answer's status.
        """
        ...


class Operation:
    """One logical operation and its key; made by ``journal.operation(operation_id)``.

    Use it as a context manager (``with`` or ``async with``) so retrying transports pick up the
    key, or put :attr:`header_value` into the request's ``Idempotency-Key`` yourself. One
    operation is one request (one method and path); a second, different request inside the same
    block would reuse the key and get ``422`` from the server.

    Attributes:
        id: the operation id.
        key: the bound key.
        journal: where it is recorded.
    """

    def __init__(self, journal: Journal, operation_id: str, key: str) -> None:
        self.journal = journal
        self.id = operation_id
        self.key = key
        self._tokens: list[contextvars.Token[Operation | None]] = []

    @classmethod
    def open(cls, journal: Journal, operation_id: str) -> Operation:
        """Claim a key for ``operation_id`` in any :class:`Journal` (durable on return).

        Args:
            journal: where the key is kept.
            operation_id: the caller's id.

        Returns:
            The operation, with the key the journal holds for the id.

        Raises:
            ConfigurationError: the id is empty or too long.
        """
        _check_id(operation_id)
        return cls(journal, operation_id, journal.claim(operation_id, str(uuid.uuid4())))

    @property
    def header_value(self) -> str:
        """The key as an ``Idempotency-Key`` value (an RFC 8941 sf-string)."""
        escaped = self.key.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'

    def finish(self, status: int) -> None:
        """Record the server's final answer (the transports call this)."""
        self.journal.finish(self.id, status)

    def __enter__(self) -> Operation:
        self._tokens.append(_current.set(self))
        return self

    def __exit__(self, *exc_info: object) -> None:
        _current.reset(self._tokens.pop())

    async def __aenter__(self) -> Operation:
        return self.__enter__()

    async def __aexit__(self, *exc_info: object) -> None:
        _current.reset(self._tokens.pop())

    def __repr__(self) -> str:
        # Never the raw key: reprs end up in logs.
        return f"<Operation {self.id!r}>"


def _check_id(operation_id: str) -> None:
    if not isinstance(operation_id, str) or not operation_id:
        raise ConfigurationError("an operation id must be a non-empty string")
    if len(operation_id) > _MAX_OPERATION_ID:
        raise ConfigurationError(f"an operation id is at most {_MAX_OPERATION_ID} characters")


class SQLiteJournal:
    """The journal in a SQLite file, shared safely by threads and processes.

    Writes are committed with ``synchronous=FULL`` before :meth:`claim` returns, so a key
    survives a SIGKILL (and a power cut) between the claim and the first send. Finished
    operations are deleted ``retention`` seconds after their final answer (match the server's
    record retention, 24 h by default); unfinished ones are kept until they finish.

    Args:
        path: the database file (created with its folder when missing).
        retention: seconds a finished operation is kept.
        busy_timeout: seconds to wait for another process's write lock.
        clock: Unix seconds (injectable for tests).

    Raises:
        ConfigurationError: a negative retention or timeout.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        retention: float = 86400.0,
        busy_timeout: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if retention < 0 or busy_timeout < 0:
            raise ConfigurationError("retention and busy_timeout must not be negative")
        self.path = Path(path)
        self.retention = retention
        self.busy_timeout = busy_timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        # Lazily, so constructing a journal (e.g. at import time of a script) touches no disk.
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not self.path.exists():
                self._create()
            if self.path.stat().st_size == 0:
                # A journal only ever appears complete (see _create), so an empty file is one
                # that was truncated or replaced: the keys of unfinished operations are gone,
                # and starting over would resend them with new keys (a second order).
                raise ConfigurationError(
                    f"the operation journal {os.fspath(self.path)!r} is empty: it was "
                    "truncated or replaced, and the keys of unfinished operations are lost. "
                    "Restore it from a backup, or delete the file to start a new journal once "
                    "you know no operation it held is unfinished."
                )
            self._conn = self._open(self.path)
            self._prune(self._conn)
        return self._conn

    def _open(self, path: Path) -> sqlite3.Connection:
        conn = sqlite3.connect(
            path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS retrysafe_operations ("
                " operation_id TEXT PRIMARY KEY,"
                " key TEXT NOT NULL,"
                " created_at REAL NOT NULL,"
                " finished_at REAL,"
                " status INTEGER)"
            )
        except BaseException:
            conn.close()  # not a database, read-only: never left for the collector
            raise
        return conn

    def _create(self) -> None:
        """Make a new journal appear whole: built beside it, then linked into place, so no
        process ever sees (or leaves, when killed) an empty file under the journal's name."""
        staging = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex}.new")
        try:
            self._open(staging).close()
            # FileExistsError: another process created it first, and theirs is whole too.
            with contextlib.suppress(FileExistsError):
                os.link(staging, self.path)
        finally:
            for leftover in (staging, Path(f"{staging}-wal"), Path(f"{staging}-shm")):
                leftover.unlink(missing_ok=True)

    def claim(self, operation_id: str, key: str) -> str:
        """Bind ``key`` to ``operation_id`` unless one is bound; see :meth:`Journal.claim`."""
        _check_id(operation_id)
        with self._lock:
            conn = self._connect()
            # One statement, atomic across processes: the first writer's key wins for everyone.
            conn.execute(
                "INSERT INTO retrysafe_operations (operation_id, key, created_at)"
                " VALUES (?, ?, ?) ON CONFLICT (operation_id) DO NOTHING",
                (operation_id, key, self._clock()),
            )
            row = conn.execute(
                "SELECT key FROM retrysafe_operations WHERE operation_id = ?", (operation_id,)
            ).fetchone()
        bound: str = row[0]
        return bound

    def finish(self, operation_id: str, status: int) -> None:
        """Record the final answer; see :meth:`Journal.finish`."""
        with self._lock:
            self._connect().execute(
                "UPDATE retrysafe_operations SET finished_at = ?, status = ?"
                " WHERE operation_id = ? AND finished_at IS NULL",
                (self._clock(), status, operation_id),
            )

    def get(self, operation_id: str) -> JournalEntry | None:
        """Return the journal row of an operation, or ``None``."""
        with self._lock:
            row = (
                self._connect()
                .execute(
                    "SELECT operation_id, key, created_at, finished_at, status"
                    " FROM retrysafe_operations WHERE operation_id = ?",
                    (operation_id,),
                )
                .fetchone()
            )
        return JournalEntry(*row) if row is not None else None

    def operation(self, operation_id: str) -> Operation:
        """Return the operation, its key claimed and durable before this returns.

        Args:
            operation_id: the caller's id: the same id after a restart resumes the same key.

        Returns:
            The operation (a context manager).

        Raises:
            ConfigurationError: the id is empty or too long.
        """
        return Operation.open(self, operation_id)

    async def aoperation(self, operation_id: str) -> Operation:
        """:meth:`operation` for async code: the durable write runs in a worker thread."""
        return await asyncio.to_thread(Operation.open, self, operation_id)

    def prune(self) -> int:
        """Delete operations finished more than ``retention`` seconds ago.

        Returns:
            How many were deleted.
        """
        with self._lock:
            return self._prune(self._connect())

    def _prune(self, conn: sqlite3.Connection) -> int:
        cursor = conn.execute(
            "DELETE FROM retrysafe_operations WHERE finished_at IS NOT NULL AND finished_at < ?",
            (self._clock() - self.retention,),
        )
        return cursor.rowcount

    def close(self) -> None:
        """Close the database connection (reopened on next use)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __repr__(self) -> str:
        return f"<SQLiteJournal {os.fspath(self.path)!r}>"
