"""Stores: where idempotency records live. Chosen by URL or passed as an instance.

=====================  ================================  ====================
URL                    classes                           extra
=====================  ================================  ====================
``memory://``          MemoryStore / AsyncMemoryStore    (none)
``sqlite:///path.db``  SQLiteStore / AsyncSQLiteStore    (none)
``postgresql://...``   PostgresStore / AsyncPostgresStore  ``retrysafe[postgres]``
``redis://...``        RedisStore / AsyncRedisStore      ``retrysafe[redis]``
``redis+cluster://``   RedisClusterStore / Async...      ``retrysafe[redis]``
=====================  ================================  ====================
"""

from __future__ import annotations

import importlib as _importlib
from typing import Any as _Any

from .._core.errors import ConfigurationError as _ConfigurationError
from .._core.records import Record, Reservation
from ._base import AsyncStore, Store
from ._inline import InlineAsyncStore as _InlineAsyncStore
from .memory import AsyncMemoryStore, MemoryStore
from .sqlite import AsyncSQLiteStore, SQLiteStore

__all__ = [
    "AsyncMemoryStore",
    "AsyncSQLiteStore",
    "AsyncStore",
    "MemoryStore",
    "Record",
    "Reservation",
    "SQLiteStore",
    "Store",
    "async_store_from_url",
    "resolve_async_store",
    "resolve_store",
    "store_from_url",
]

# scheme -> (module, async class, sync class, extra)
_REGISTRY: dict[str, tuple[str, str, str, str | None]] = {
    "memory": ("retrysafe.stores.memory", "AsyncMemoryStore", "MemoryStore", None),
    "sqlite": ("retrysafe.stores.sqlite", "AsyncSQLiteStore", "SQLiteStore", None),
    "postgresql": ("retrysafe.stores.postgres", "AsyncPostgresStore", "PostgresStore", "postgres"),
    "postgres": ("retrysafe.stores.postgres", "AsyncPostgresStore", "PostgresStore", "postgres"),
    "redis": ("retrysafe.stores.redis", "AsyncRedisStore", "RedisStore", "redis"),
    "rediss": ("retrysafe.stores.redis", "AsyncRedisStore", "RedisStore", "redis"),
    "redis+cluster": (
        "retrysafe.stores.redis_cluster",
        "AsyncRedisClusterStore",
        "RedisClusterStore",
        "redis",
    ),
    "rediss+cluster": (
        "retrysafe.stores.redis_cluster",
        "AsyncRedisClusterStore",
        "RedisClusterStore",
        "redis",
    ),
}


def _store_class(url: str, index: int) -> _Any:
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in _REGISTRY:
        known = ", ".join(sorted(f"{s}://" for s in _REGISTRY))
        raise _ConfigurationError(
            f"unknown store URL scheme in {url.split('://')[0]!r}: use {known}"
        )
    entry = _REGISTRY[scheme]
    class_name = entry[index]
    assert class_name is not None
    try:
        module = _importlib.import_module(entry[0])
    except ImportError as exc:
        raise _ConfigurationError(
            f"the {scheme}:// store needs an extra: pip install 'retrysafe[{entry[3]}]' ({exc})"
        ) from exc
    return getattr(module, class_name)


def async_store_from_url(url: str) -> AsyncStore:
    """Build the async store a URL names.

    Args:
        url: ``memory://``, ``sqlite:///path.db``, ``postgresql://...``, ``redis://...``.

    Returns:
        The store (connections are opened lazily).

    Raises:
        ConfigurationError: unknown scheme, or the extra that the scheme needs is not installed.
    """
    store: AsyncStore = _store_class(url, 1).from_url(url)
    return store


def store_from_url(url: str) -> Store:
    """Build the synchronous store a URL names; see :func:`async_store_from_url`."""
    store: Store = _store_class(url, 2).from_url(url)
    return store


def resolve_async_store(store: str | AsyncStore | Store) -> AsyncStore:
    """Accept a URL, an async store, or a local synchronous store (run inline).

    Raises:
        ConfigurationError: the object is not a store, or is a network sync store.
    """
    if isinstance(store, str):
        return async_store_from_url(store)
    if isinstance(store, AsyncStore):
        return store
    if isinstance(store, Store):
        return _InlineAsyncStore(store)
    raise _ConfigurationError(f"not a store or store URL: {store!r}")


def resolve_store(store: str | Store) -> Store:
    """Accept a URL or a synchronous store.

    Raises:
        ConfigurationError: the object is not a synchronous store.
    """
    if isinstance(store, str):
        return store_from_url(store)
    if isinstance(store, Store) and not hasattr(store, "aclose"):
        return store
    raise _ConfigurationError(f"not a synchronous store or store URL: {store!r}")
