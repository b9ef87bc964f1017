"""SQLite store: the embedded default. Zero set-up, shared by every process using the file.

Connections are opened lazily, one per thread, in autocommit mode with ``journal_mode=WAL``,
``synchronous=NORMAL`` and a ``busy_timeout``. Every operation is one statement (reserve is an
``INSERT ... ON CONFLICT DO UPDATE ... WHERE ... RETURNING``), so each is atomic under SQLite's
write lock across threads and processes. The async face calls SQLite inline on the event loop;
see :mod:`retrysafe.stores._inline` for why. It never blocks the loop on another writer's lock:
its connections have ``busy_timeout=0`` and a busy statement is retried after an ``await``ed
back-off (:func:`retry_while_busy`) until the store's ``busy_timeout`` runs out (a blocking wait
would freeze the loop, and with it the very request that holds the lock, when that request is in
the same process).

SQLite has one writer at a time, and in transactional mode a handler holds that lock from its
first write to its commit. A reservation that meets the lock taken is still answered at once
when its key already has a record that decides it (in progress, completed, outcome unknown,
another fingerprint): WAL readers never wait for the writer, so that answer comes from a read.
Only a key that needs a write (new, expired, or a lapsed lease to take over) queues for the lock,
by default for as long as the lease it asks for (``busy_timeout`` in the URL overrides it).

The package: ``_store.py`` (the sync store), ``_async_store.py`` (its async face), ``_busy.py``
(waiting for the write lock: turns and the awaited back-off), ``_async_tx.py`` and its
generated twin ``_sync_tx.py`` (a request's transaction), ``_url.py``, ``_liveness.py``
(owner liveness) and ``sqlite.sql``. ``parse_sqlite_url``, ``busy_timeout_option``,
``file_key`` and ``retry_while_busy`` are public for code that keeps its own tables beside the
store's (the demo's data layer).
"""

from __future__ import annotations

from .._registry import Backend, register_backend
from ._async_store import AsyncSQLiteStore
from ._async_tx import AsyncSQLiteTransaction
from ._busy import DEFAULT_BUSY_TIMEOUT, SQLiteBusyError, file_key, retry_while_busy
from ._store import SQLiteStore
from ._sync_tx import SQLiteTransaction
from ._url import URL_OPTIONS, busy_timeout_option, parse_sqlite_url

__all__ = [
    "DEFAULT_BUSY_TIMEOUT",
    "AsyncSQLiteStore",
    "AsyncSQLiteTransaction",
    "SQLiteBusyError",
    "SQLiteStore",
    "SQLiteTransaction",
    "busy_timeout_option",
    "file_key",
    "parse_sqlite_url",
    "retry_while_busy",
]

register_backend(
    Backend(
        name="sqlite",
        schemes=("sqlite",),
        store=SQLiteStore,
        async_store=AsyncSQLiteStore,
        options=URL_OPTIONS,
    )
)
