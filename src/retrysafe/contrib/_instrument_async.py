"""The async face of an instrumented store: wraps an async store and observes each operation.

Built by :func:`retrysafe.contrib._instrument.instrument` (shared by
:mod:`retrysafe.contrib.prometheus` and :mod:`retrysafe.contrib.otel`; imports neither library).
The wrapper implements :class:`~retrysafe.stores.AsyncStore` and, when the wrapped store is a SQL
store with transactional mode, its ``begin`` too (the transaction's begin, commit and rollback are
observed as ``begin``, ``commit`` and ``rollback``). Wrappers nest. Each face names the other
(``as_sync()`` here), so one instrumented store serves ASGI, WSGI, Flask and Django alike.

The sync face, ``_instrument_sync.py``, is generated from this file by ``scripts/unasync.py``
(``make lint`` checks it is up to date): edit this file, then run the script.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._core.records import Record, Reservation
from .._core.transaction import AsyncTransaction, ForwardedState
from ..stores import AsyncStore

if TYPE_CHECKING:
    from ._instrument import Observe

__all__ = ["InstrumentedSQLStore", "InstrumentedStore", "InstrumentedTransaction", "wrap"]


class InstrumentedStore:
    """An :class:`~retrysafe.stores.AsyncStore` that observes every call of the one it wraps.

    Use :func:`wrap` to build one (it adds ``begin`` only when the wrapped store has it).

    Args:
        inner: the async store to wrap.
        observe: ``observe(operation)`` returns the context manager around one call.
        source: what the store was built from (a URL or a store object), for the other face.
        face: the other face, when it was built first.
    """

    def __init__(
        self, inner: AsyncStore, observe: Observe, source: object = None, face: Any = None
    ) -> None:
        self.inner = inner
        self._observe = observe
        self._source = inner if source is None else source
        self._face = face

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "_observe", "_source", "_face"):  # not set yet (e.g. copying)
            raise AttributeError(name)
        # Anything else (prefix, options, ensure_schema...) is the wrapped store's.
        return getattr(self.inner, name)

    def as_sync(self) -> Any:
        """The synchronous face, for WSGI, Flask and Django (the store resolvers ask for it):
        the same observer over the synchronous face of the wrapped store, built once.

        Raises:
            ConfigurationError: the wrapped store has no synchronous face (the message names
                what to pass instead).
        """
        if self._face is None:
            from ._instrument import sync_face
            from ._instrument_sync import wrap as wrap_face

            inner = sync_face(self._source, self.inner)
            self._face = wrap_face(inner, self._observe, self._source, self)
        return self._face

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


class InstrumentedTransaction(ForwardedState):
    """A transaction whose begin (first :meth:`connection`), commit and rollback are observed.

    Args:
        inner: the wrapped store's transaction.
        observe: as for :class:`InstrumentedStore`.
    """

    def __init__(self, inner: AsyncTransaction, observe: Observe) -> None:
        self.inner = self.wrapped = inner
        self._observe = observe

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


def wrap(
    inner: AsyncStore, observe: Observe, source: object = None, face: Any = None
) -> InstrumentedStore:
    """Wrap an async store so that ``observe`` sees every operation.

    Args:
        inner: the store to wrap.
        observe: ``observe(operation)`` returns the context manager around one call; it sees
            the exception of a failed call in ``__exit__``.
        source: what ``inner`` was built from (a URL or a store object), for the other face.
        face: the other face, when it was built first.

    Returns:
        The wrapping store; it has ``begin`` exactly when the wrapped store has it.
    """
    if callable(getattr(inner, "begin", None)):
        return InstrumentedSQLStore(inner, observe, source, face)
    return InstrumentedStore(inner, observe, source, face)
