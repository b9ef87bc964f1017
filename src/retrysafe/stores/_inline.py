"""Async face for stores whose operations are fast, local calls (memory, SQLite).

Such a store is called directly on the event loop: a SQLite statement costs about 20 us while a
hand-off to a thread (``to_thread``, aiosqlite, an executor) adds 100-250 us per call, measured on
this project's machines. Network stores (Redis, PostgreSQL) have real async implementations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from .._core.errors import ConfigurationError
from .._core.records import Record, Reservation
from ._base import Store

__all__ = ["InlineAsyncStore"]

T = TypeVar("T")


class InlineAsyncStore:
    """Runs a synchronous local store's operations inline on the event loop.

    Args:
        store: the synchronous store; its operations must not wait on the network.
    """

    def __init__(self, store: Store) -> None:
        if not getattr(store, "inline_safe", False):
            raise ConfigurationError(
                f"{type(store).__name__} waits on the network; use its async twin"
            )
        self.sync = store

    async def _call(self, operation: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one operation; subclasses add waiting (e.g. for a SQLite write lock)."""
        return operation(*args, **kwargs)

    async def reserve(
        self, record_id: str, fingerprint: str, *, lease: float, ttl: float
    ) -> Reservation:
        """See :meth:`retrysafe.stores.AsyncStore.reserve`."""
        return await self._call(self.sync.reserve, record_id, fingerprint, lease=lease, ttl=ttl)

    async def renew(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.renew`."""
        return await self._call(self.sync.renew, record_id, token, lease=lease)

    async def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.complete`."""
        return await self._call(self.sync.complete, record_id, token, response, ttl=ttl)

    async def mark_committed(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.mark_committed`."""
        return await self._call(self.sync.mark_committed, record_id, token, lease=lease)

    async def delete(self, record_id: str) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.delete`."""
        return await self._call(self.sync.delete, record_id)

    async def release(self, record_id: str, token: str) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.release`."""
        return await self._call(self.sync.release, record_id, token)

    async def get(self, record_id: str) -> Record | None:
        """See :meth:`retrysafe.stores.AsyncStore.get`."""
        return await self._call(self.sync.get, record_id)

    async def purge_expired(self) -> int:
        """See :meth:`retrysafe.stores.AsyncStore.purge_expired`."""
        return await self._call(self.sync.purge_expired)

    async def aclose(self) -> None:
        """Close the underlying store."""
        self.sync.close()
