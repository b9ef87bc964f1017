"""Stores: where idempotency records live. Chosen by URL or passed as an instance.

=========================  ====================================  =============================
URL                        classes                               extra
=========================  ====================================  =============================
``memory://``              MemoryStore / AsyncMemoryStore        (none)
``sqlite:///path.db``      SQLiteStore / AsyncSQLiteStore        (none)
``postgresql://...``       PostgresStore / AsyncPostgresStore    ``retrysafe[postgres]``
``mysql://...``            MySQLStore / AsyncMySQLStore          ``retrysafe[mysql]``
``redis://...``            RedisStore / AsyncRedisStore          ``retrysafe[redis]``
``redis+cluster://...``    RedisClusterStore / Async...          ``retrysafe[redis]``
``django://alias``         DjangoStore / AsyncDjangoStore        ``retrysafe[django]``
=========================  ====================================  =============================

Each backend is a package of its own that declares its schemes, URL options and extra and
registers itself (:class:`Backend`, :func:`register_backend`); the built-in ones register when
this package is imported, without importing their drivers. Other packages register schemes by
the same call or by an entry point in the ``retrysafe.stores`` group (the Django ORM store does).
"""

from __future__ import annotations

from .._core.records import Record, Reservation
from . import memory, mysql, postgres, redis, sqlite  # noqa: F401  (the built-in backends register)
from ._base import AsyncStore, Store, StoreStats
from ._registry import (
    Backend,
    async_store_from_url,
    parse_store_url,
    register_backend,
    resolve_async_store,
    resolve_store,
    store_from_url,
)
from ._url import StoreURL
from .memory import AsyncMemoryStore, MemoryStore
from .sqlite import AsyncSQLiteStore, SQLiteStore

__all__ = [
    "AsyncMemoryStore",
    "AsyncSQLiteStore",
    "AsyncStore",
    "Backend",
    "MemoryStore",
    "Record",
    "Reservation",
    "SQLiteStore",
    "Store",
    "StoreStats",
    "StoreURL",
    "async_store_from_url",
    "parse_store_url",
    "register_backend",
    "resolve_async_store",
    "resolve_store",
    "store_from_url",
]
