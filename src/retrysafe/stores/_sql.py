"""Read named SQL statements from a backend package's ``.sql`` file.

A file holds several statements, each introduced by a ``-- name: NAME`` line.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

from .._core.records import Record

__all__ = ["load_queries", "record_from_row", "settled_from_row"]


def record_from_row(row: tuple[Any, ...], now: float) -> Record:
    """A record from a ``(fingerprint, state, lease_expires_at, response)`` row of the SQL
    stores that keep wall-clock seconds (SQLite, the Django ORM store); state 0 in progress,
    1 completed, 2 in progress with its effects committed."""
    fingerprint, state, lease_expires_at, response = row
    if state == 1:
        return Record(fingerprint, "completed", bytes(response))
    return Record(
        fingerprint,
        "in_progress",
        lease_remaining=max(0.0, lease_expires_at - now),
        committed=state == 2,
    )


def settled_from_row(row: tuple[Any, ...] | None, now: float) -> Record | None:
    """The record of a ``get`` row (as for :func:`record_from_row`) when it decides a
    reservation without a write: completed, in progress under a live lease, or committed
    (outcome unknown once its lease lapsed). ``None`` for no row or a lapsed lease that a
    reservation takes over, which only the write decides.

    On SQLite's single writer this is what lets a duplicate, a replay or a mismatch be answered
    from a read (WAL readers never wait) while another request's transaction holds the lock.
    """
    if row is None or (row[1] == 0 and row[2] <= now):
        return None
    return record_from_row(row, now)


@functools.cache
def load_queries(package: str, filename: str) -> dict[str, str]:
    """Return ``{name: statement}`` for the file ``filename`` of ``package``
    (``load_queries("retrysafe.stores.sqlite", "sqlite.sql")``)."""
    text = resources.files(package).joinpath(filename).read_text("utf-8")
    queries: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("-- name:"):
            if name is not None:
                queries[name] = "\n".join(lines).strip().rstrip(";")
            name = line.split(":", 1)[1].strip()
            lines = []
        elif name is not None:
            lines.append(line)
    if name is not None:
        queries[name] = "\n".join(lines).strip().rstrip(";")
    return queries
