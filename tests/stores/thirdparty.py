"""A third-party store backend, written outside retrysafe the way another package would: it uses
only the public API (``retrysafe.stores.Backend``, ``register_backend``, ``StoreURL``, the
records) and registers the ``tiny://<table>`` scheme by a call (:func:`register`) or, as the
``tiny-ep://`` scheme, by an entry point (:data:`ENTRY_POINT_BACKEND`).

The store keeps each named table in this process's memory, one tuple per record, behind one lock;
stores opened with the same name share the table (the async face, run inline by the registry, and
the sync one). Its option ``?clock_skew=`` shifts its clock, to show options reaching the
constructor.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

from retrysafe.stores import Backend, Record, Reservation, StoreURL, register_backend

__all__ = ["BACKEND", "ENTRY_POINT_BACKEND", "TinyStore", "register", "registered"]

# (fingerprint, token, state, lease end, retention end, response); state "r"unning,
# "c"ommitted (effects done, never taken over) or "d"one.
_Row = tuple[str, str | None, str, float, float, bytes | None]
_FIELDS = ("fp", "token", "state", "lease", "expires", "response")
_tables: dict[str, dict[str, _Row]] = {}
_locks: dict[str, threading.Lock] = {}
_tokens = itertools.count(1)
_guard = threading.Lock()


class TinyStore:
    """A small in-process store that keeps the whole store contract.

    Args:
        table: the name of the shared table.
        clock_skew: seconds added to the clock.
    """

    inline_safe = True  # every call is a dict operation: the async face runs it inline
    kind = "tiny"

    def __init__(self, table: str, *, clock_skew: float = 0.0) -> None:
        with _guard:
            self._rows = _tables.setdefault(table, {})
            self._lock = _locks.setdefault(table, threading.Lock())
        self._skew = clock_skew

    @classmethod
    def from_url(cls, url: StoreURL) -> TinyStore:
        return cls(url.location or "default", **url.options)

    def _now(self) -> float:
        return time.monotonic() + self._skew

    def _live(self, record_id: str, now: float) -> _Row | None:
        row = self._rows.get(record_id)
        if row is None or row[4] <= now:
            return None
        return row

    def reserve(self, record_id: str, fingerprint: str, *, lease: float, ttl: float) -> Reservation:
        with self._lock:
            now = self._now()
            row = self._live(record_id, now)
            if row is None or (row[2] == "r" and row[3] <= now):
                token = f"tiny-{next(_tokens)}"
                self._rows[record_id] = (fingerprint, token, "r", now + lease, now + ttl, None)
                return Reservation(token=token)
            return Reservation(record=self._record(row, now))

    @staticmethod
    def _record(row: _Row, now: float) -> Record:
        fingerprint, _, state, lease_end, _, response = row
        if state == "d":
            return Record(fingerprint, "completed", response)
        left = max(0.0, lease_end - now)
        return Record(fingerprint, "in_progress", lease_remaining=left, committed=state == "c")

    def _held(self, record_id: str, token: str, now: float) -> _Row | None:
        row = self._live(record_id, now)
        return row if row is not None and row[1] == token and row[2] != "d" else None

    def _update(self, record_id: str, token: str, **changes: Any) -> bool:
        with self._lock:
            now = self._now()
            row = self._held(record_id, token, now)
            if row is None:
                return False
            fields = dict(
                zip(("fp", "token", "state", "lease", "expires", "response"), row, strict=True)
            )
            fields.update({k: v(now) if callable(v) else v for k, v in changes.items()})
            self._rows[record_id] = tuple(fields.values())  # type: ignore[assignment]
            return True

    def renew(self, record_id: str, token: str, *, lease: float) -> bool:
        return self._update(record_id, token, lease=lambda now: now + lease)

    def mark_committed(self, record_id: str, token: str, *, lease: float) -> bool:
        return self._update(record_id, token, state="c", lease=lambda now: now + lease)

    def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        return self._update(
            record_id, token, state="d", response=response, expires=lambda now: now + ttl
        )

    def release(self, record_id: str, token: str) -> bool:
        with self._lock:
            if self._held(record_id, token, self._now()) is None:
                return False
            del self._rows[record_id]
            return True

    def delete(self, record_id: str) -> bool:
        with self._lock:
            return self._rows.pop(record_id, None) is not None

    def get(self, record_id: str) -> Record | None:
        with self._lock:
            now = self._now()
            row = self._live(record_id, now)
            return None if row is None else self._record(row, now)

    def purge_expired(self) -> int:
        with self._lock:
            now = self._now()
            gone = [rid for rid, row in self._rows.items() if row[4] <= now]
            for rid in gone:
                del self._rows[rid]
            return len(gone)

    def close(self) -> None:
        pass


def _seconds(value: str) -> float:
    return float(value)


BACKEND = Backend(
    name="tiny",
    schemes=("tiny",),
    store=TinyStore,  # no async class: the registry runs this inline-safe store on the loop
    options={"clock_skew": _seconds},
)

#: The same store under another scheme, declared for an entry point (by "module:Class" path,
#: as a package that keeps its driver import lazy would).
ENTRY_POINT_BACKEND = Backend(
    name="tiny-ep",
    schemes=("tiny-ep",),
    store="tests.stores.thirdparty:TinyStore",
    options={"clock_skew": _seconds},
)


def register() -> None:
    """Register ``tiny://`` (what the package would do on import)."""
    register_backend(BACKEND)


@contextlib.contextmanager
def registered() -> Iterator[None]:
    """``tiny://`` registered for a while: the registry as it was afterwards (test isolation,
    so other tests see only the schemes a fresh process has)."""
    from retrysafe.stores import _registry

    saved = dict(_registry._by_scheme)
    register()
    try:
        yield
    finally:
        _registry._by_scheme.clear()
        _registry._by_scheme.update(saved)
