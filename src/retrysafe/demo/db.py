"""OrderHub's own data: orders and payments, in a SQLite file (``--db``)."""

from __future__ import annotations

import sqlite3
import threading
from typing import Any

from .._errors import ConfigurationError
from ..stores.sqlite import parse_sqlite_url

__all__ = ["OrderDB", "open_db"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS orderhub_orders (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    owner TEXT NOT NULL,
    item TEXT NOT NULL,
    quantity INTEGER NOT NULL,
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE TABLE IF NOT EXISTS orderhub_payments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    owner TEXT NOT NULL,
    amount INTEGER NOT NULL,
    currency TEXT NOT NULL,
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
"""

_COLUMNS = {
    "orders": ("id", "owner", "item", "quantity", "created_at"),
    "payments": ("id", "owner", "amount", "currency", "created_at"),
}


class OrderDB:
    """Orders and payments in SQLite; statements run inline (each is ~20 us).

    Args:
        path: the SQLite file, shared by every OrderHub process pointed at it.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout = 5000")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.executescript(_SCHEMA)
            self._local.conn = conn
        return conn

    def _row(self, kind: str, row: tuple[Any, ...]) -> dict[str, Any]:
        return dict(zip(_COLUMNS[kind], row, strict=True))

    def add(self, kind: str, owner: str, **values: Any) -> dict[str, Any]:
        """Insert an order or a payment and return it."""
        table = f"orderhub_{kind}"
        names = ", ".join(("owner", *values))
        marks = ", ".join("?" * (len(values) + 1))
        cols = ", ".join(_COLUMNS[kind])
        row = (
            self._conn()
            .execute(
                f"INSERT INTO {table} ({names}) VALUES ({marks}) RETURNING {cols}",
                (owner, *values.values()),
            )
            .fetchone()
        )
        return self._row(kind, row)

    def list(self, kind: str, limit: int | None = None) -> tuple[int, list[dict[str, Any]]]:
        """Return (total count, records newest first, at most ``limit``)."""
        conn = self._conn()
        table = f"orderhub_{kind}"
        (count,) = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
        sql = f"SELECT {', '.join(_COLUMNS[kind])} FROM {table} ORDER BY id DESC"
        params: tuple[int, ...] = ()
        if limit is not None:
            sql += " LIMIT ?"
            params = (limit,)
        return count, [self._row(kind, r) for r in conn.execute(sql, params)]

    def get(self, kind: str, record_id: int) -> dict[str, Any] | None:
        """Return one record or ``None``."""
        row = (
            self._conn()
            .execute(
                f"SELECT {', '.join(_COLUMNS[kind])} FROM orderhub_{kind} WHERE id = ?",
                (record_id,),
            )
            .fetchone()
        )
        return None if row is None else self._row(kind, row)

    def reset(self) -> None:
        """Delete every order and payment."""
        conn = self._conn()
        conn.execute("DELETE FROM orderhub_orders")
        conn.execute("DELETE FROM orderhub_payments")


def open_db(url: str) -> OrderDB:
    """Open the demo database a URL names (``sqlite:///path.db``).

    Raises:
        ConfigurationError: another scheme.
    """
    if not url.startswith("sqlite:///"):
        raise ConfigurationError(f"OrderHub keeps its data in SQLite (sqlite:///...), got {url!r}")
    path, _ = parse_sqlite_url(url)
    return OrderDB(path)
