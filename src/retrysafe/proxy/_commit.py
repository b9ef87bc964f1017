"""The commit mark folded into the reservation, when the upstream connection is already in hand.

A keyed request through the proxy costs three store round trips: the reservation, the commit
mark just before the first byte leaves, and the completion. The mark must come after the
proxy holds an upstream connection (a request still queued for one must not be marked: if the
store then fails, it is answered ``503`` and never sent). When an idle pooled connection is
there before the reservation (the common case), nothing is left to wait for between the two,
so the reservation itself can be written committed (the store's ``reserve_committed``: one
round trip instead of two on Redis, one statement instead of two on SQLite) and the proxy's mark
is already done:

    _Front:  conn = pool.take_idle()  ->  READY = Ready(conn)
    middleware: store.reserve(...)    ->  reserve_committed(...) (won: Ready.token = token)
    proxy:   takes Ready.conn; mark_committed(scope) -> answered from Ready.token, no store call

A request that finds no idle connection (the pool exhausted), a store without
``reserve_committed``, a key taken over from a dead owner: the usual reservation and mark.
Between the committed reservation and the first byte there is only this process's own work on
a connection it holds (no wait), as between the mark and the first byte otherwise. A committed
reservation that is not forwarded after all (the client left, the connection turned out
closed) is released as a marked one is: the key is freed, the record deleted.
"""

from __future__ import annotations

from collections.abc import Awaitable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from .._core.records import Record, Reservation
from ..stores import AsyncStore

if TYPE_CHECKING:
    from ._upstream import Connection

__all__ = ["READY", "CommitOnReserve", "Ready"]


class Ready:
    """An idle upstream connection taken for the current request before its reservation."""

    __slots__ = ("conn", "token")

    def __init__(self, conn: Connection) -> None:
        self.conn: Connection | None = conn
        #: The token of a reservation written committed (the proxy's mark is then done).
        self.token: str | None = None


#: The current request's :class:`Ready`, set by the proxy's front around its middleware.
READY: ContextVar[Ready | None] = ContextVar("retrysafe_proxy_ready", default=None)


async def _done() -> bool:
    return True


class CommitOnReserve:
    """The proxy's view of a store that has ``reserve_committed``: the reservation of a request
    holding an upstream connection is written committed, and that request's first mark is then
    answered without a round trip. Everything else goes to the store unchanged.

    Args:
        store: the async store (with ``reserve_committed``).
    """

    def __init__(self, store: AsyncStore) -> None:
        self.store = store
        self._reserve_committed = store.reserve_committed  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        # The optional parts of a store (kind, stats, expires_records...), as the store has them.
        return getattr(self.store, name)

    def reserve(
        self, record_id: str, fingerprint: str, *, lease: float, ttl: float
    ) -> Awaitable[Reservation]:
        """See :meth:`retrysafe.stores.AsyncStore.reserve`."""
        ready = READY.get()
        if ready is None or ready.conn is None:
            return self.store.reserve(record_id, fingerprint, lease=lease, ttl=ttl)
        return self._reserve(ready, record_id, fingerprint, lease, ttl)

    async def _reserve(
        self, ready: Ready, record_id: str, fingerprint: str, lease: float, ttl: float
    ) -> Reservation:
        reservation: Reservation
        committed: bool
        reservation, committed = await self._reserve_committed(
            record_id, fingerprint, lease=lease, ttl=ttl
        )
        if committed:
            ready.token = reservation.token
        return reservation

    def mark_committed(self, record_id: str, token: str, *, lease: float) -> Awaitable[bool]:
        """See :meth:`retrysafe.stores.AsyncStore.mark_committed`: the first mark of a
        reservation written committed is already in the store."""
        ready = READY.get()
        if ready is not None and ready.token is not None and ready.token == token:
            ready.token = None  # a later mark (the lease of a failure) goes to the store
            return _done()
        return self.store.mark_committed(record_id, token, lease=lease)

    def renew(self, record_id: str, token: str, *, lease: float) -> Awaitable[bool]:
        """See :meth:`retrysafe.stores.AsyncStore.renew`."""
        return self.store.renew(record_id, token, lease=lease)

    def complete(
        self, record_id: str, token: str, response: bytes, *, ttl: float
    ) -> Awaitable[bool]:
        """See :meth:`retrysafe.stores.AsyncStore.complete`."""
        return self.store.complete(record_id, token, response, ttl=ttl)

    def release(self, record_id: str, token: str) -> Awaitable[bool]:
        """See :meth:`retrysafe.stores.AsyncStore.release`."""
        return self.store.release(record_id, token)

    def delete(self, record_id: str) -> Awaitable[bool]:
        """See :meth:`retrysafe.stores.AsyncStore.delete`."""
        return self.store.delete(record_id)

    def get(self, record_id: str) -> Awaitable[Record | None]:
        """See :meth:`retrysafe.stores.AsyncStore.get`."""
        return self.store.get(record_id)

    def purge_expired(self) -> Awaitable[int]:
        """See :meth:`retrysafe.stores.AsyncStore.purge_expired`."""
        return self.store.purge_expired()

    def aclose(self) -> Awaitable[None]:
        """See :meth:`retrysafe.stores.AsyncStore.aclose`."""
        return self.store.aclose()
