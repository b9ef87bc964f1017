"""What a store holds, for operators: ``retrysafe stats`` and ``retrysafe purge --dry-run``.

Each store counts its own records (its optional ``stats()`` method: one query on SQL stores,
one scan on Redis); nothing here knows a backend. Read-only; never part of a request.
"""

from __future__ import annotations

from .._core.errors import ConfigurationError
from ..stores import Store
from ..stores._base import StoreStats

__all__ = ["StoreStats", "store_stats"]


def store_stats(store: Store) -> StoreStats:
    """Count the records of a synchronous store by state.

    Args:
        store: a store from :func:`retrysafe.stores.store_from_url` (memory, SQLite,
            PostgreSQL, Redis, Redis Cluster) or any store with a ``stats()`` method.

    Returns:
        The counts.

    Raises:
        ConfigurationError: the store has no statistics (no ``stats()`` method).
        StoreUnavailableError: the store could not be read.
    """
    stats = getattr(store, "stats", None)
    if not callable(stats):
        raise ConfigurationError(f"no statistics for {type(store).__name__} stores")
    counted: StoreStats = stats()
    return counted
