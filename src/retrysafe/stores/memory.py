"""In-process store: a dict behind one lock. For tests, development and single-process apps.

Owner liveness is the process itself: a record belongs to the instance id that reserved it. After
``fork`` the child's copy of the dict still holds its parent's in-progress records, which no one
will ever renew or complete in that copy (the parent works on its own), so the child takes them
over at once (a committed one is outcome unknown, as everywhere). From the fork on, parent and
child each have their own store: a key one of them completes is new to the other (share a SQLite
file, PostgreSQL or Redis between processes).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from .._core._mypyc import mypyc_attr
from .._core.records import Record, Reservation, new_token
from ._base import StoreStats
from ._fork import reset_after_fork
from ._inline import InlineAsyncStore
from ._registry import Backend, parse_store_url, register_backend
from ._url import StoreURL

__all__ = ["AsyncMemoryStore", "MemoryStore"]


@dataclass(slots=True)
class _Entry:
    fingerprint: str
    token: str | None
    lease_expires_at: float
    expires_at: float
    response: bytes | None = None
    committed: bool = False
    owner: str = ""
    #: The answer to a reservation of the completed record (the same every time: made once).
    replay: Reservation | None = None


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled, still open to Python subclasses
class MemoryStore:
    """Keeps records in this process's memory (lost on restart, not shared between processes).

    Args:
        clock: returns the current time in seconds (injectable for tests).
    """

    # Class variables, also when compiled (mypyc makes a plain class attribute an instance's).
    inline_safe: ClassVar[bool] = True
    kind: ClassVar[str] = "memory"

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._fork_hold = reset_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: a new lock (one held by another of the parent's threads at the
        fork would never be released here). The records stay: the child's own copy."""
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str | StoreURL = "memory://") -> MemoryStore:
        """Build from ``memory://``."""
        if isinstance(url, str):
            parse_store_url(url)
        return cls()

    @staticmethod
    def _record(entry: _Entry, now: float) -> Record:
        if entry.response is not None:
            return Record(entry.fingerprint, "completed", entry.response)
        if entry.owner != new_token.prefix:  # instance_id(), written out (the hot path)
            now = entry.lease_expires_at  # its owner is another process: dead to this copy
        return Record(
            entry.fingerprint,
            "in_progress",
            lease_remaining=max(0.0, entry.lease_expires_at - now),
            committed=entry.committed,
        )

    # reserve and complete are every keyed request's two calls, written for it (each trick
    # measured in instructions): lease and ttl are taken by position too, which the async face
    # does, since CPython inlines a call without keywords; the lock is taken with acquire() and
    # released in finally (a with block costs about 1k instructions more); instance_id() and
    # _owned() are written out.
    def reserve(self, record_id: str, fingerprint: str, lease: float, ttl: float) -> Reservation:
        """See :meth:`retrysafe.stores.Store.reserve`."""
        owner = new_token.prefix  # instance_id()
        lock = self._lock
        lock.acquire()
        try:
            now = self._clock()
            entry = self._entries.get(record_id)
            if (
                entry is None
                or entry.expires_at <= now
                or (
                    entry.response is None
                    and not entry.committed
                    and (entry.lease_expires_at <= now or entry.owner != owner)
                )
            ):
                token = new_token()
                self._entries[record_id] = _Entry(
                    fingerprint, token, now + lease, now + ttl, None, False, owner
                )
                return Reservation(token)
            if entry.response is not None:
                replay = entry.replay
                if replay is None:
                    replay = entry.replay = Reservation(None, self._record(entry, now))
                return replay
            return Reservation(None, self._record(entry, now))
        finally:
            lock.release()

    def _owned(self, record_id: str, token: str) -> _Entry | None:
        entry = self._entries.get(record_id)
        if entry is None or entry.token != token or entry.response is not None:
            return None
        return entry

    def _extend(self, record_id: str, token: str, lease: float, *, commit: bool) -> bool:
        with self._lock:
            entry = self._owned(record_id, token)
            if entry is None:
                return False
            entry.committed = entry.committed or commit
            entry.lease_expires_at = self._clock() + lease
            return True

    def renew(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.Store.renew`."""
        return self._extend(record_id, token, lease, commit=False)

    def mark_committed(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.Store.mark_committed`."""
        return self._extend(record_id, token, lease, commit=True)

    def delete(self, record_id: str) -> bool:
        """See :meth:`retrysafe.stores.Store.delete`."""
        with self._lock:
            return self._entries.pop(record_id, None) is not None

    def complete(self, record_id: str, token: str, response: bytes, ttl: float) -> bool:
        """See :meth:`retrysafe.stores.Store.complete`."""
        lock = self._lock
        lock.acquire()
        try:
            entry = self._entries.get(record_id)  # _owned()
            if entry is None or entry.token != token or entry.response is not None:
                return False
            entry.response = response
            entry.expires_at = self._clock() + ttl
            return True
        finally:
            lock.release()

    def release(self, record_id: str, token: str) -> bool:
        """See :meth:`retrysafe.stores.Store.release`."""
        with self._lock:
            if self._owned(record_id, token) is None:
                return False
            del self._entries[record_id]
            return True

    def get(self, record_id: str) -> Record | None:
        """See :meth:`retrysafe.stores.Store.get`."""
        with self._lock:
            now = self._clock()
            entry = self._entries.get(record_id)
            if entry is None or entry.expires_at <= now:
                return None
            return self._record(entry, now)

    def purge_expired(self) -> int:
        """See :meth:`retrysafe.stores.Store.purge_expired`."""
        with self._lock:
            now = self._clock()
            dead = [rid for rid, entry in self._entries.items() if entry.expires_at <= now]
            for rid in dead:
                del self._entries[rid]
            return len(dead)

    def stats(self) -> StoreStats:
        """Count the records by state (see :class:`~retrysafe.stores.StoreStats`)."""
        counts = dict.fromkeys(("completed", "in_progress", "committed", "outcome_unknown"), 0)
        lapsed = expired = 0
        oldest: float | None = None
        with self._lock:
            now = self._clock()
            entries = list(self._entries.values())
        for entry in entries:
            if entry.expires_at <= now:
                expired += 1
            elif entry.response is not None:
                counts["completed"] += 1
            elif entry.lease_expires_at <= now:
                if entry.committed:
                    counts["outcome_unknown"] += 1
                else:
                    lapsed += 1
            else:
                counts["committed" if entry.committed else "in_progress"] += 1
                left = entry.expires_at - now
                oldest = left if oldest is None else min(oldest, left)
        return StoreStats(
            lapsed=lapsed, oldest_in_progress_retention_left=oldest, expired=expired, **counts
        )

    def close(self) -> None:
        """Nothing to release."""


class AsyncMemoryStore(InlineAsyncStore):
    """The async face of :class:`MemoryStore` (operations run inline; they never wait).

    Args:
        clock: returns the current time in seconds (injectable for tests).
    """

    sync: MemoryStore

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        super().__init__(MemoryStore(clock=clock))

    @classmethod
    def from_url(cls, url: str | StoreURL = "memory://") -> AsyncMemoryStore:
        """Build from ``memory://``."""
        if isinstance(url, str):
            parse_store_url(url)
        return cls()

    # The two operations of every keyed request, without the wrapper coroutine of _call (the
    # memory store never waits).
    async def reserve(
        self, record_id: str, fingerprint: str, *, lease: float, ttl: float
    ) -> Reservation:
        """See :meth:`retrysafe.stores.AsyncStore.reserve`."""
        return self.sync.reserve(record_id, fingerprint, lease, ttl)

    async def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.complete`."""
        return self.sync.complete(record_id, token, response, ttl)


register_backend(
    Backend(name="memory", schemes=("memory",), store=MemoryStore, async_store=AsyncMemoryStore)
)
