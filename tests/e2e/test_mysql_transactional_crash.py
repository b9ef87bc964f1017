"""Transactional mode on MySQL/MariaDB behind ASGI and WSGI (the URL store) and behind Django's
WSGI and ASGI handlers (the Django ORM store on a MySQL database): a server SIGKILLed at points
spread over a request (before its write, between its write and the commit, after it answered)
leaves the order and its idempotency record both committed (the retry replays) or neither (the
retry runs once), never one without the other."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httpx
import pytest

from retrysafe.stores import store_from_url

from ..stores import backend_mysql
from .servers import free_port

pytestmark = pytest.mark.e2e

#: Seconds after the request was sent at which the server is killed; ``None``: once it answered.
KILL_AFTER = (0.0, 0.2, None)
SLEEP_AFTER = "0.25"  # the handler's pause between its write and the commit


class Server:
    def __init__(self, kind: str, *args: str) -> None:
        self.port = free_port()
        module = "mysql_django_app" if kind.startswith("django") else "mysql_tx_app"
        kind = kind.removeprefix("django-")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", f"tests.e2e.{module}", kind, *args, str(self.port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"
        self.url = f"http://127.0.0.1:{self.port}/orders"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _send(url: str, order: str, headers: dict[str, str], answered: threading.Event) -> None:
    try:
        httpx.post(url, json={"order": order}, headers=headers, timeout=10)
        answered.set()
    except httpx.HTTPError:
        pass  # the server died under it


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    made: list[Server] = []
    yield made
    for server in made:
        if server.proc.poll() is None:
            server.kill()


def _django_case(request: pytest.FixtureRequest) -> tuple[tuple[str, ...], Any, Any]:
    """The Django server's arguments, and counts of orders and of completed records."""
    url = backend_mysql.fresh_database_url(request)
    database = urlsplit(url).path.strip("/")

    def count(sql: str, *args: str) -> int:
        with backend_mysql.admin_connect(url) as conn, conn.cursor() as cur:
            cur.execute(f"USE `{database}`")
            cur.execute(sql, args)
            return int(cur.fetchone()[0])

    def orders(order: str) -> int:
        return count("SELECT count(*) FROM orders WHERE k = %s", order)

    def completed() -> int:
        return count("SELECT count(*) FROM retrysafe_record WHERE state = 1")

    return (url, database), orders, completed


def _url_store_case(request: pytest.FixtureRequest) -> tuple[tuple[str, ...], Any, Any]:
    """The URL-store server's arguments, and counts of orders and of completed records."""
    store_url = backend_mysql.fresh_table_url(request)
    records = dict(parse_qsl(urlsplit(store_url).query))["table"]
    table = records + "_orders"
    with backend_mysql.admin_connect(store_url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {table} (k VARCHAR(200) NOT NULL) ENGINE=InnoDB")
    store = store_from_url(store_url)
    store.get("warm-up")  # creates the records table
    store.close()

    def count(sql: str, *args: str) -> int:
        with backend_mysql.admin_connect(store_url) as conn, conn.cursor() as cur:
            cur.execute(sql, args)
            return int(cur.fetchone()[0])

    def orders(order: str) -> int:
        return count(f"SELECT count(*) FROM {table} WHERE k = %s", order)

    def completed() -> int:
        return count(f"SELECT count(*) FROM {records} WHERE state = 1")

    return (store_url, table), orders, completed


@pytest.mark.parametrize("kind", ["asgi", "wsgi", "django-wsgi", "django-asgi"])
def test_a_killed_server_leaves_the_order_and_its_record_both_or_neither(
    kind: str, request: pytest.FixtureRequest, servers: list[Server]
) -> None:
    case = _django_case if kind.startswith("django") else _url_store_case
    args, orders, completed = case(request)
    seen: set[tuple[int, bool]] = set()
    for done, delay in enumerate(KILL_AFTER):  # done: completed records before this round
        order = f"o-{uuid.uuid4().hex}"
        headers = {"Idempotency-Key": order, "X-Sleep-After": SLEEP_AFTER}
        server = Server(kind, *args)
        servers.append(server)
        answered = threading.Event()

        sender = threading.Thread(target=_send, args=(server.url, order, headers, answered))
        sender.start()
        if delay is None:
            assert answered.wait(10)
        else:
            time.sleep(delay)
        server.kill()
        sender.join(timeout=15)
        stored = completed() - done
        rows = orders(order)
        assert (rows, stored) in ((0, 0), (1, 1)), (delay, rows, stored)
        seen.add((rows, bool(stored)))
        # The retry (on a new server: the dead one's lease lapses) replays or runs once.
        again = Server(kind, *args)
        servers.append(again)
        deadline = time.monotonic() + 15
        while True:
            retry = httpx.post(again.url, json={"order": order}, headers=headers, timeout=10)
            if retry.status_code != 409 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert retry.status_code == 201, retry.text
        assert retry.json() == {"order": order}
        assert orders(order) == 1
        assert completed() == done + 1
        again.kill()
    assert (1, True) in seen and (0, False) in seen
