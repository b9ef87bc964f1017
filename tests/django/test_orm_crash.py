"""Both or neither under SIGKILL: the Django OrderHub (gunicorn, several workers, the Django ORM
store) is killed between the order's INSERT and its answer; the order and the stored response
are then both absent, and the retry commits exactly one order."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from .server import DjangoDemo, django_demo, pg_schema_url

__all__ = ["django_demo"]

pytestmark = pytest.mark.e2e

KEY = {"Idempotency-Key": '"crash-1"', "Content-Type": "application/json"}
ORDER = '{"item": "crash", "quantity": 1}'


class Database:
    """Direct reads of the demo's database (never through the server)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        if self.url.startswith("sqlite:///"):
            with sqlite3.connect(self.url[10:], timeout=10) as conn:
                return conn.execute(sql).fetchall()
        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute(sql).fetchall()

    def orders(self) -> int:
        return int(self.query("SELECT count(*) FROM orderhub_django_orders")[0][0])

    def states(self) -> list[int]:
        return [row[0] for row in self.query("SELECT state FROM retrysafe_record")]

    def write_in_flight(self) -> bool:
        """Whether some connection holds an uncommitted write (the order's INSERT)."""
        if self.url.startswith("sqlite:///"):
            conn = sqlite3.connect(self.url[10:], timeout=0, isolation_level=None)
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("ROLLBACK")
                return False
            except sqlite3.OperationalError:  # "database is locked": a writer is active
                return True
            finally:
                conn.close()
        rows = self.query(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_xid IS NOT NULL "
            "AND pid <> pg_backend_pid() AND query LIKE '%orderhub_django_orders%'"
        )
        return bool(rows[0][0])


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/orderhub.db"
    return pg_schema_url(request)


@pytest.fixture(params=["wsgi", "asgi"])
def asgi(request: pytest.FixtureRequest) -> bool:
    """gunicorn (sync runner, several workers) or uvicorn (async runner: the atomic block and
    the view's ORM writes share the request's thread-sensitive thread)."""
    return request.param == "asgi"


def test_sigkill_between_the_write_and_the_answer_leaves_neither(
    django_demo: Callable[..., DjangoDemo], db_url: str, asgi: bool
) -> None:
    lease = 1.5
    server = django_demo(db_url, lease=lease, workers=2, asgi=asgi)
    db = Database(db_url)
    results: list[Any] = []

    def send() -> None:
        try:
            results.append(
                httpx.post(server.url + "/orders?delay_after_ms=20000", content=ORDER,
                           headers=KEY, timeout=30)
            )  # fmt: skip
        except httpx.TransportError as exc:
            results.append(exc)

    client = threading.Thread(target=send)
    client.start()
    deadline = time.monotonic() + 15
    while not (db.states() == [0] and db.write_in_flight()):
        assert time.monotonic() < deadline, "the order's INSERT never started"
        time.sleep(0.02)
    if db_url.startswith("sqlite:///"):
        # SQLite shows the writer (its lock), not the row: the INSERT follows the lock within
        # microseconds, then the view sleeps 20 s; kill well inside that sleep.
        time.sleep(0.3)
    server.kill()
    client.join(10)
    assert isinstance(results[0], httpx.TransportError)  # the client never got an answer
    assert db.orders() == 0  # neither the order...
    assert db.states() == [0]  # ...nor the response: the key is only reserved (lease)

    restarted = django_demo(db_url, lease=lease, workers=2, asgi=asgi)
    time.sleep(lease)  # the dead request's lease lapses
    first = httpx.post(restarted.url + "/orders", content=ORDER, headers=KEY, timeout=10)
    assert first.status_code == 201
    again = httpx.post(restarted.url + "/orders", content=ORDER, headers=KEY, timeout=10)
    assert again.headers["idempotency-replayed"] == "true"
    assert again.content == first.content
    assert db.orders() == 1 and db.states() == [1]  # both


def test_an_answered_request_left_both_behind(
    django_demo: Callable[..., DjangoDemo], db_url: str
) -> None:
    server = django_demo(db_url, workers=2)
    db = Database(db_url)
    response = httpx.post(server.url + "/orders", content=ORDER, headers=KEY, timeout=10)
    assert response.status_code == 201
    server.kill()  # right after the answer: nothing is left to flush
    assert db.orders() == 1
    assert db.states() == [1]
