"""The store contract shared by every backend.

A store keeps one record per scoped key (:mod:`retrysafe._core.records`). ``reserve`` is the
single atomic step that decides the winner; ``renew``, ``complete`` and ``release`` are
compare-and-set on the reservation's token (fencing), so a process that lost its lease can
neither overwrite nor delete the record of the request that took over.

Optional, beside the contract: ``stats()`` (:class:`StoreStats`, what ``retrysafe stats``
shows), ``begin()`` (transactional mode, SQL stores), ``kind`` (a short name of the backend, for
metric labels), ``as_async()`` (a synchronous store's async face, when it is not simply run
inline).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

from .._core.records import Record, Reservation

__all__ = ["AsyncStore", "Store", "StoreStats"]


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Counts of the records in a store, by state (a store's optional ``stats()``).

    Attributes:
        completed: records with a stored response (replayed to retries).
        in_progress: requests running now (lease live, effects not declared committed).
        committed: requests running now whose effects are committed (``mark_committed``).
        outcome_unknown: effects committed, response never stored, lease lapsed: retries get
            ``409`` until an operator runs ``retrysafe resolve``.
        lapsed: in progress with a lapsed lease (the owner died); the next retry takes it over.
        oldest_in_progress_retention_left: seconds of retention left on the oldest live
            in-progress record (``None``: none); its age is the retention minus this.
        expired: records whose retention ended, which ``retrysafe purge`` would delete (0 where
            the server expires records by itself, as Redis does).
    """

    completed: int
    in_progress: int
    committed: int
    outcome_unknown: int
    lapsed: int
    oldest_in_progress_retention_left: float | None
    expired: int

    @classmethod
    def from_row(cls, row: Any) -> StoreStats:
        """From a SQL row in the order of the attributes."""
        left = row[5]
        return cls(
            completed=int(row[0]),
            in_progress=int(row[1]),
            committed=int(row[2]),
            outcome_unknown=int(row[3]),
            lapsed=int(row[4]),
            oldest_in_progress_retention_left=None if left is None else float(left),
            expired=int(row[6]),
        )

    def as_dict(self) -> dict[str, Any]:
        """The counts as a JSON-ready dict."""
        return asdict(self)


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
