"""What a store holds, for operators: ``retrysafe stats`` and ``retrysafe purge --dry-run``.

Read-only, one query (SQL stores) or one scan (Redis) per call; never part of a request.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

from .._core.errors import ConfigurationError, StoreUnavailableError
from ..stores import Store
from ..stores._sql import load_queries

__all__ = ["StoreStats", "store_stats"]

_REDIS_BATCH = 500


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Counts of the records in a store.

    Attributes:
        completed: records with a stored response (replayed to retries).
        in_progress: requests running now (lease live, effects not declared committed).
        committed: requests running now whose effects are committed (``mark_committed``).
        outcome_unknown: effects committed, response never stored, lease lapsed: retries get
            ``409`` until an operator runs ``retrysafe resolve``.
        lapsed: in progress with a lapsed lease (the owner died); the next retry takes it over.
        oldest_in_progress_retention_left: seconds of retention left on the oldest live
            in-progress record (``None``: none); its age is the retention minus this.
        expired: records whose retention ended, which ``retrysafe purge`` would delete (Redis:
            always 0, it expires records itself).
    """

    completed: int
    in_progress: int
    committed: int
    outcome_unknown: int
    lapsed: int
    oldest_in_progress_retention_left: float | None
    expired: int

    def as_dict(self) -> dict[str, Any]:
        """The counts as a JSON-ready dict."""
        return asdict(self)


def _from_row(row: Any) -> StoreStats:
    left = row[5]
    return StoreStats(
        completed=int(row[0]),
        in_progress=int(row[1]),
        committed=int(row[2]),
        outcome_unknown=int(row[3]),
        lapsed=int(row[4]),
        oldest_in_progress_retention_left=None if left is None else float(left),
        expired=int(row[6]),
    )


def _sqlite(store: Any) -> StoreStats:
    import sqlite3

    conn = store.open_connection()
    try:
        row = conn.execute(load_queries("stats.sql")["sqlite_stats"], {"now": time.time()})
        return _from_row(row.fetchone())
    except sqlite3.Error as exc:
        raise StoreUnavailableError(f"sqlite stats failed: {exc}", store="sqlite") from exc
    finally:
        store.forget_connection(conn)


def _postgres(store: Any) -> StoreStats:
    import psycopg

    options = store.options
    sql = load_queries("stats.sql")["postgres_stats"].replace("{table}", options.quoted_table)
    try:
        with psycopg.connect(
            options.dsn, autocommit=True, connect_timeout=max(2, math.ceil(options.connect_timeout))
        ) as conn:
            return _from_row(conn.execute(sql).fetchone())
    except psycopg.errors.UndefinedTable as exc:
        raise ConfigurationError(
            f"no table {options.table} in that database (retrysafe schema apply creates it)"
        ) from exc
    except (psycopg.Error, OSError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StoreUnavailableError(f"postgres stats failed: {message}", store="postgres") from exc


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _redis(store: Any) -> StoreStats:
    from redis.exceptions import RedisError

    client = store._client
    counts = {"completed": 0, "in_progress": 0, "committed": 0, "outcome_unknown": 0}
    oldest: float | None = None
    try:
        seconds, micros = client.time()
        now_ms = seconds * 1000 + micros // 1000
        batch: list[Any] = []

        def flush() -> None:
            nonlocal oldest
            pipe = client.pipeline(transaction=False)
            for name in batch:
                pipe.hmget(name, "s", "l", "x")
            for state, lease_end, retention_end in pipe.execute():
                if state is None:
                    continue  # expired or released since the scan saw it
                if state == b"1":
                    counts["completed"] += 1
                    continue
                if state == b"2" and lease_end is not None and int(lease_end) <= now_ms:
                    counts["outcome_unknown"] += 1
                    continue
                # A state-0 record lives only while its lease does (its TTL is the lease).
                counts["committed" if state == b"2" else "in_progress"] += 1
                if retention_end is not None:
                    left = (int(retention_end) - now_ms) / 1000
                    oldest = left if oldest is None else min(oldest, left)
            batch.clear()

        pattern = _glob_escape(store.prefix) + "*"
        for name in client.scan_iter(match=pattern, count=_REDIS_BATCH):
            batch.append(name)
            if len(batch) >= _REDIS_BATCH:
                flush()
        if batch:
            flush()
    except (RedisError, OSError) as exc:
        raise StoreUnavailableError(f"redis stats failed: {exc}", store="redis") from exc
    return StoreStats(lapsed=0, oldest_in_progress_retention_left=oldest, expired=0, **counts)


def _memory(store: Any) -> StoreStats:
    now = time.time()
    counts = dict.fromkeys(("completed", "in_progress", "committed", "outcome_unknown"), 0)
    lapsed = expired = 0
    oldest: float | None = None
    with store._lock:
        entries = list(store._entries.values())
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


def store_stats(store: Store) -> StoreStats:
    """Count the records of a synchronous store by state.

    Args:
        store: a store from :func:`retrysafe.stores.store_from_url` (memory, SQLite,
            PostgreSQL or Redis).

    Returns:
        The counts.

    Raises:
        ConfigurationError: the store kind has no statistics (a custom store).
        StoreUnavailableError: the store could not be read.
    """
    kind = type(store).__name__
    readers = {
        "SQLiteStore": _sqlite,
        "PostgresStore": _postgres,
        "RedisStore": _redis,
        "MemoryStore": _memory,
    }
    reader = readers.get(kind)
    if reader is None:
        raise ConfigurationError(f"no statistics for {kind} stores")
    return reader(store)
