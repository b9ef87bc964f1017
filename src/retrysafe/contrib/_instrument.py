"""A store that wraps another and observes each operation (latency metrics, trace spans).

Shared by :mod:`retrysafe.contrib.prometheus` and :mod:`retrysafe.contrib.otel`; imports neither
library. The wrapper implements :class:`~retrysafe.stores.AsyncStore` and, when the wrapped store
is a SQL store with transactional mode, its ``begin`` too (the transaction's begin, commit and
rollback are observed as ``begin``, ``commit`` and ``rollback``). Wrappers nest: a store wrapped
for Prometheus can be wrapped again for OpenTelemetry.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from .._core.records import Record, Reservation
from .._core.transaction import AsyncTransaction
from ..stores import AsyncStore, Store, resolve_async_store

__all__ = ["OUTCOMES", "InstrumentedStore", "Observe", "instrument", "store_kind"]

#: ``on_event`` event -> the request's outcome (the metrics' ``outcome`` label, the span's
#: ``idempotency.outcome``).
OUTCOMES: dict[str, str] = {
    "executed": "executed",
    "replayed": "replayed",
    "conflict": "in_progress",
    "mismatch": "mismatch",
    "invalid_key": "invalid_key",
    "missing_key": "missing_key",
    "too_large": "too_large",
    "store_error": "store_unavailable",
    "fail_open": "fail_open",
    "outcome_unknown": "outcome_unknown",
}

#: Returns a context manager that observes one store operation, given the operation's name.
Observe = Callable[[str], AbstractContextManager[Any]]


def store_kind(store: object) -> str:
    """A short, bounded name for a store's backend (a metric label): ``sqlite``, ``redis``...

    Args:
        store: a store instance (async, inline-wrapped sync, or instrumented).

    Returns:
        The store's own ``kind`` (its backend says it), else the lower-case class name.
    """
    inner = getattr(store, "inner", None) or getattr(store, "sync", None)
    if inner is not None and inner is not store:
        return store_kind(inner)
    kind = getattr(type(store), "kind", None)
    return kind if isinstance(kind, str) else type(store).__name__.lower()


class InstrumentedStore:
    """An :class:`~retrysafe.stores.AsyncStore` that observes every call of the one it wraps.

    Use :func:`instrument` to build one (it adds ``begin`` only when the wrapped store has it).

    Args:
        inner: the async store to wrap.
        observe: ``observe(operation)`` returns the context manager around one call.
    """

    def __init__(self, inner: AsyncStore, observe: Observe) -> None:
        self.inner = inner
        self._observe = observe

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (e.g. while copying): no recursion
            raise AttributeError(name)
        # Anything else (prefix, options, ensure_schema...) is the wrapped store's.
        return getattr(self.inner, name)

    async def reserve(
        self, record_id: str, fingerprint: str, *, lease: float, ttl: float
    ) -> Reservation:
        """See :meth:`retrysafe.stores.AsyncStore.reserve`."""
        with self._observe("reserve"):
            return await self.inner.reserve(record_id, fingerprint, lease=lease, ttl=ttl)

    async def renew(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.renew`."""
        with self._observe("renew"):
            return await self.inner.renew(record_id, token, lease=lease)

    async def mark_committed(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.mark_committed`."""
        with self._observe("mark_committed"):
            return await self.inner.mark_committed(record_id, token, lease=lease)

    async def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.complete`."""
        with self._observe("complete"):
            return await self.inner.complete(record_id, token, response, ttl=ttl)

    async def release(self, record_id: str, token: str) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.release`."""
        with self._observe("release"):
            return await self.inner.release(record_id, token)

    async def delete(self, record_id: str) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.delete`."""
        with self._observe("delete"):
            return await self.inner.delete(record_id)

    async def get(self, record_id: str) -> Record | None:
        """See :meth:`retrysafe.stores.AsyncStore.get`."""
        with self._observe("get"):
            return await self.inner.get(record_id)

    async def purge_expired(self) -> int:
        """See :meth:`retrysafe.stores.AsyncStore.purge_expired`."""
        with self._observe("purge_expired"):
            return await self.inner.purge_expired()

    async def aclose(self) -> None:
        """Close the wrapped store."""
        await self.inner.aclose()


class InstrumentedSQLStore(InstrumentedStore):
    """An :class:`InstrumentedStore` over a SQL store: also ``begin`` (transactional mode)."""

    def begin(self) -> AsyncTransaction:
        """Open the wrapped store's transaction object, observed."""
        return InstrumentedTransaction(self.inner.begin(), self._observe)  # type: ignore[attr-defined]


class InstrumentedTransaction:
    """A transaction whose begin (first :meth:`connection`), commit and rollback are observed.

    Args:
        inner: the wrapped store's transaction.
        observe: as for :class:`InstrumentedStore`.
    """

    def __init__(self, inner: AsyncTransaction, observe: Observe) -> None:
        self.inner = inner
        self._observe = observe

    @property
    def begun(self) -> bool:
        """See :attr:`retrysafe._core.transaction.AsyncTransaction.begun`."""
        return self.inner.begun

    @property
    def broken(self) -> bool:
        """See :attr:`retrysafe._core.transaction.AsyncTransaction.broken`."""
        return self.inner.broken

    @property
    def holds_write_lock(self) -> bool:
        """Whether the wrapped transaction holds its database's single write lock (SQLite)."""
        return bool(getattr(self.inner, "holds_write_lock", False))

    async def connection(self) -> Any:
        """Begin the transaction if needed (observed as ``begin``); return its connection."""
        if self.inner.begun:
            return await self.inner.connection()
        with self._observe("begin"):
            return await self.inner.connection()

    async def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """Write the completion record and commit (observed as ``commit``)."""
        with self._observe("commit"):
            return await self.inner.complete(record_id, token, response, ttl=ttl)

    async def rollback(self) -> None:
        """Roll back (observed as ``rollback``)."""
        with self._observe("rollback"):
            await self.inner.rollback()

    async def close(self) -> None:
        """Give the connection back."""
        await self.inner.close()


def instrument(store: str | AsyncStore | Store, observe: Observe) -> InstrumentedStore:
    """Wrap a store (URL, async or local sync store) so that ``observe`` sees every operation.

    Args:
        store: what :class:`~retrysafe.asgi.IdempotencyMiddleware` accepts as ``store``.
        observe: ``observe(operation)`` returns the context manager around one call; it sees
            the exception of a failed call in ``__exit__``.

    Returns:
        The wrapping store; it has ``begin`` exactly when the wrapped store has it.

    Raises:
        ConfigurationError: ``store`` is not a store or store URL.
    """
    inner = resolve_async_store(store)
    if callable(getattr(inner, "begin", None)):
        return InstrumentedSQLStore(inner, observe)
    return InstrumentedStore(inner, observe)
