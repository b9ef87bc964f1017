"""The store contract shared by every backend.

A store keeps one record per scoped key (:mod:`retrysafe._core.records`). ``reserve`` is the
single atomic step that decides the winner; ``renew``, ``complete`` and ``release`` are
compare-and-set on the reservation's token (fencing), so a process that lost its lease can
neither overwrite nor delete the record of the request that took over.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .._core.records import Record, Reservation

__all__ = ["AsyncStore", "Store"]


@runtime_checkable
class AsyncStore(Protocol):
    """The asynchronous store interface (ASGI)."""

    async def reserve(
        self, record_id: str, fingerprint: str, *, lease: float, ttl: float
    ) -> Reservation:
        """Atomically reserve ``record_id`` or return the record that holds it.

        A record whose retention ended, or an in-progress record whose lease lapsed (its owner
        crashed), is taken over by this call. So is an in-progress record whose owner process
        is known to be dead (owner liveness; the lease stays the backstop for what liveness
        cannot see), at once, whatever its lease: fenced like a lease takeover. A committed
        record whose owner is dead is never taken over: it is returned with
        ``lease_remaining == 0`` (outcome unknown).
        """
        ...

    async def renew(self, record_id: str, token: str, *, lease: float) -> bool:
        """Extend the lease; ``False`` when ``token`` no longer holds the key."""
        ...

    async def mark_committed(self, record_id: str, token: str, *, lease: float) -> bool:
        """Record that the request's side effects are committed (and extend the lease).

        From then on a lapsed lease is not taken over: a crash between the effects and the
        completion leaves an "outcome unknown" record instead of a second execution.
        ``False`` when ``token`` no longer holds the key.
        """
        ...

    async def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """Store the response and keep it ``ttl`` seconds; ``False`` when fenced out."""
        ...

    async def release(self, record_id: str, token: str) -> bool:
        """Delete the reservation so a retry can run; ``False`` when fenced out."""
        ...

    async def delete(self, record_id: str) -> bool:
        """Delete a record whatever its state (an operator resolving an unknown outcome)."""
        ...

    async def get(self, record_id: str) -> Record | None:
        """Return the live record of ``record_id``, if any."""
        ...

    async def purge_expired(self) -> int:
        """Delete records whose retention ended; return how many."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


@runtime_checkable
class Store(Protocol):
    """The synchronous store interface (WSGI, Django, scripts); same semantics as AsyncStore."""

    def reserve(self, record_id: str, fingerprint: str, *, lease: float, ttl: float) -> Reservation:
        """See :meth:`AsyncStore.reserve`."""
        ...

    def renew(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`AsyncStore.renew`."""
        ...

    def mark_committed(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`AsyncStore.mark_committed`."""
        ...

    def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """See :meth:`AsyncStore.complete`."""
        ...

    def release(self, record_id: str, token: str) -> bool:
        """See :meth:`AsyncStore.release`."""
        ...

    def delete(self, record_id: str) -> bool:
        """See :meth:`AsyncStore.delete`."""
        ...

    def get(self, record_id: str) -> Record | None:
        """See :meth:`AsyncStore.get`."""
        ...

    def purge_expired(self) -> int:
        """See :meth:`AsyncStore.purge_expired`."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...
