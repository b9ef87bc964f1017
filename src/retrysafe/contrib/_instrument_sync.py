# Generated from src/retrysafe/contrib/_instrument_async.py by scripts/unasync.py: do not edit.
"""The sync face of an instrumented store: wraps a synchronous store and observes each operation.

Built by :func:`retrysafe.contrib._instrument.instrument` (shared by
:mod:`retrysafe.contrib.prometheus` and :mod:`retrysafe.contrib.otel`; imports neither library).
The wrapper implements :class:`~retrysafe.stores.Store` and, when the wrapped store is a SQL
store with transactional mode, its ``begin`` too (the transaction's begin, commit and rollback are
observed as ``begin``, ``commit`` and ``rollback``). Wrappers nest. Each face names the other
(``as_async()`` here), so one instrumented store serves ASGI, WSGI, Flask and Django alike.

This file is generated from ``_instrument_async.py`` by ``scripts/unasync.py``
(``make lint`` checks it): edit that file, then run the script.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._core.records import Record, Reservation
from .._core.transaction import ForwardedState, Transaction
from ..stores import Store

if TYPE_CHECKING:
    from ._instrument import Observe

__all__ = [
    "SyncInstrumentedSQLStore",
    "SyncInstrumentedStore",
    "SyncInstrumentedTransaction",
    "wrap",
]


class SyncInstrumentedStore:
    """An :class:`~retrysafe.stores.Store` that observes every call of the one it wraps.

    Use :func:`wrap` to build one (it adds ``begin`` only when the wrapped store has it).

    Args:
        inner: the synchronous store to wrap.
        observe: ``observe(operation)`` returns the context manager around one call.
        source: what the store was built from (a URL or a store object), for the other face.
        face: the other face, when it was built first.
    """

    def __init__(
        self, inner: Store, observe: Observe, source: object = None, face: Any = None
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

    def as_async(self) -> Any:
        """The async face, for ASGI (the store resolvers ask for it): the same observer
        over the async face of the wrapped store, built once.

        Raises:
            ConfigurationError: the wrapped store has no async face (the message names
                what to pass instead).
        """
        if self._face is None:
            from ._instrument import async_face
            from ._instrument_async import wrap as wrap_face

            inner = async_face(self._source, self.inner)
            self._face = wrap_face(inner, self._observe, self._source, self)
        return self._face

    def reserve(self, record_id: str, fingerprint: str, *, lease: float, ttl: float) -> Reservation:
        """See :meth:`retrysafe.stores.Store.reserve`."""
        with self._observe("reserve"):
            return self.inner.reserve(record_id, fingerprint, lease=lease, ttl=ttl)

    def renew(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.Store.renew`."""
        with self._observe("renew"):
            return self.inner.renew(record_id, token, lease=lease)

    def mark_committed(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.Store.mark_committed`."""
        with self._observe("mark_committed"):
            return self.inner.mark_committed(record_id, token, lease=lease)

    def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """See :meth:`retrysafe.stores.Store.complete`."""
        with self._observe("complete"):
            return self.inner.complete(record_id, token, response, ttl=ttl)

    def release(self, record_id: str, token: str) -> bool:
        """See :meth:`retrysafe.stores.Store.release`."""
        with self._observe("release"):
            return self.inner.release(record_id, token)

    def delete(self, record_id: str) -> bool:
        """See :meth:`retrysafe.stores.Store.delete`."""
        with self._observe("delete"):
            return self.inner.delete(record_id)

    def get(self, record_id: str) -> Record | None:
        """See :meth:`retrysafe.stores.Store.get`."""
        with self._observe("get"):
            return self.inner.get(record_id)

    def purge_expired(self) -> int:
        """See :meth:`retrysafe.stores.Store.purge_expired`."""
        with self._observe("purge_expired"):
            return self.inner.purge_expired()

    def close(self) -> None:
        """Close the wrapped store."""
        self.inner.close()


class SyncInstrumentedSQLStore(SyncInstrumentedStore):
    """An :class:`SyncInstrumentedStore` over a SQL store: also ``begin`` (transactional mode)."""

    def begin(self) -> Transaction:
        """Open the wrapped store's transaction object, observed."""
        return SyncInstrumentedTransaction(self.inner.begin(), self._observe)  # type: ignore[attr-defined]


class SyncInstrumentedTransaction(ForwardedState):
    """A transaction whose begin (first :meth:`connection`), commit and rollback are observed.

    Args:
        inner: the wrapped store's transaction.
        observe: as for :class:`SyncInstrumentedStore`.
    """

    def __init__(self, inner: Transaction, observe: Observe) -> None:
        self.inner = self.wrapped = inner
        self._observe = observe

    def connection(self) -> Any:
        """Begin the transaction if needed (observed as ``begin``); return its connection."""
        if self.inner.begun:
            return self.inner.connection()
        with self._observe("begin"):
            return self.inner.connection()

    def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """Write the completion record and commit (observed as ``commit``)."""
        with self._observe("commit"):
            return self.inner.complete(record_id, token, response, ttl=ttl)

    def rollback(self) -> None:
        """Roll back (observed as ``rollback``)."""
        with self._observe("rollback"):
            self.inner.rollback()

    def close(self) -> None:
        """Give the connection back."""
        self.inner.close()


def wrap(
    inner: Store, observe: Observe, source: object = None, face: Any = None
) -> SyncInstrumentedStore:
    """Wrap a synchronous store so that ``observe`` sees every operation.

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
        return SyncInstrumentedSQLStore(inner, observe, source, face)
    return SyncInstrumentedStore(inner, observe, source, face)
