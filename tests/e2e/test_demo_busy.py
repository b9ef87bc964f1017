"""OrderHub on its default SQLite store while a transactional request holds the write lock: the
single writer makes new writes queue (up to the bound, then 503 problems), never answers 500,
and never delays an answer that a read can give; on every framework's OrderHub."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from retrysafe.demo.app import create_app
from retrysafe.demo.domain import Settings
from retrysafe.demo.serve import SERVERS

from ..integrations.helpers import client_for
from ..stores.test_sqlite_busy import holding
from .servers import DemoServer

PAYMENT = {"amount": 12, "currency": "EUR"}
ALICE = {"Authorization": "Bearer alice"}
BOB = {"Authorization": "Bearer bob"}
HOLD_MS = 6000  # longer than the 5 s the old bound allowed


def _locked(path: Path) -> bool:
    probe = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as exc:
        assert "locked" in str(exc)
        return True
    finally:
        probe.close()


def _problem(response: httpx.Response) -> str:
    assert response.headers["content-type"] == "application/problem+json", response.text
    body = json.loads(response.content)
    assert body["status"] == response.status_code
    kind: str = body["type"]
    return kind.rsplit(":", 1)[-1]


@pytest.mark.e2e
async def test_a_handler_holding_the_write_lock_delays_new_writes_and_nothing_else(
    demo_servers: Callable[..., DemoServer], tmp_path: Path
) -> None:
    path = tmp_path / "demo.db"
    server = demo_servers(f"sqlite:///{path}")
    base = server.url
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        done = await client.post(
            "/payments", json=PAYMENT, headers={**ALICE, "Idempotency-Key": '"k0"'}
        )
        assert done.status_code == 201

        slow_headers = {**ALICE, "Idempotency-Key": '"k1"'}
        slow_url = f"/payments?delay_after_ms={HOLD_MS}"
        slow = asyncio.create_task(client.post(slow_url, json=PAYMENT, headers=slow_headers))
        for _ in range(200):  # until the slow handler has written (and holds the lock)
            if _locked(path):
                break
            await asyncio.sleep(0.01)
        assert _locked(path)

        # Keys with a record: answered from a read while the lock is held.
        duplicate = await client.post(slow_url, json=PAYMENT, headers=slow_headers)
        reused = await client.post(slow_url, json={**PAYMENT, "amount": 13}, headers=slow_headers)
        replay = await client.post(
            "/payments", json=PAYMENT, headers={**ALICE, "Idempotency-Key": '"k0"'}
        )
        assert _locked(path) and not slow.done()
        assert duplicate.status_code == 409 and int(duplicate.headers["retry-after"]) >= 1
        assert _problem(duplicate) == "idempotency-request-in-progress"
        assert reused.status_code == 422 and _problem(reused) == "idempotency-key-reused"
        assert replay.status_code == 201 and replay.headers["idempotency-replayed"] == "true"
        assert replay.json() == done.json()

        # New writes queue for the lock (longer than the old 5 s bound) and then go through.
        fresh = asyncio.create_task(
            client.post("/payments", json=PAYMENT, headers={**BOB, "Idempotency-Key": '"b1"'})
        )
        unkeyed = asyncio.create_task(
            client.post("/orders", json={"item": "tea", "quantity": 1}, headers=BOB)
        )
        await asyncio.sleep(0.3)
        assert not fresh.done() and not unkeyed.done() and _locked(path)
        first = await slow
        queued = await asyncio.gather(fresh, unkeyed)
        assert first.status_code == 201
        assert [r.status_code for r in queued] == [201, 201], [r.text for r in queued]
        payments = (await client.get("/payments")).json()
        orders = (await client.get("/orders")).json()
    assert payments["count"] == 3 and orders["count"] == 1


async def test_orderhub_answers_a_database_that_stays_busy_with_503_problems(
    tmp_path: Path,
) -> None:
    """With ``busy_timeout`` in the URLs below the hold, every write gives up with a 503
    problem and Retry-After, never a 500; reads and replays are unaffected."""
    path = tmp_path / "demo.db"
    url = f"sqlite:///{path}?busy_timeout=0.2"
    app = create_app(Settings(store=url, db=url))
    async with client_for(app) as client:
        keyed = {**ALICE, "Idempotency-Key": '"p1"'}
        done = await client.post("/payments", json=PAYMENT, headers=keyed)
        assert done.status_code == 201
        with holding(path) as holder:
            order = await client.post("/orders", json={"item": "tea", "quantity": 1})
            reset = await client.post("/reset")
            fresh = await client.post(
                "/payments", json=PAYMENT, headers={**ALICE, "Idempotency-Key": '"p2"'}
            )
            replay = await client.post("/payments", json=PAYMENT, headers=keyed)
            listing = await client.get("/payments")
            assert holder.still_holds()
        for response in (order, reset):
            assert response.status_code == 503, response.text
            assert _problem(response) == "database-unavailable"
            assert int(response.headers["retry-after"]) >= 1
        assert fresh.status_code == 503 and _problem(fresh) == "idempotency-store-unavailable"
        assert int(fresh.headers["retry-after"]) >= 1
        assert replay.status_code == 201 and replay.headers["idempotency-replayed"] == "true"
        assert listing.json()["count"] == 1
        # Nothing was left half-done: the same requests work once the lock is free.
        again = await client.post(
            "/payments", json=PAYMENT, headers={**ALICE, "Idempotency-Key": '"p2"'}
        )
        order = await client.post("/orders", json={"item": "tea", "quantity": 1})
        assert again.status_code == 201 and order.status_code == 201


FRAMEWORKS = list(SERVERS)
ORDER = {"item": "tea", "quantity": 1}


def _hub(demo_servers: Callable[..., DemoServer], store: str, framework: str) -> DemoServer:
    # Two workers where the framework runs several: the lock holder and the waiter may then be
    # served by different processes, as on a real deployment.
    return demo_servers(store, extra_args=("--framework", framework))


@pytest.mark.e2e
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_write_behind_a_request_holding_the_lock_waits_for_it_on_every_orderhub(
    demo_servers: Callable[..., DemoServer], tmp_path: Path, framework: str
) -> None:
    """A keyed ``POST /orders?delay_after_ms=6500`` holds SQLite's write lock (its order commits
    with its record); a keyless ``POST /orders`` a second later waits past 5 s (where the Flask
    OrderHub used to answer 500 with a traceback) and is created."""
    path = tmp_path / "store.db"
    server = _hub(demo_servers, f"sqlite:///{path}", framework)
    with httpx.Client(base_url=server.url, timeout=30) as client, ThreadPoolExecutor(1) as pool:
        holder = pool.submit(
            client.post,
            "/orders?delay_after_ms=6500",
            json=ORDER,
            headers={"Idempotency-Key": '"holder"'},
        )
        deadline = time.monotonic() + 10
        while not _locked(path):
            assert time.monotonic() < deadline and not holder.done(), "the lock was never taken"
            time.sleep(0.01)
        time.sleep(1.0)
        started = time.monotonic()
        waiter = client.post("/orders", json=ORDER)
        waited = time.monotonic() - started
        first = holder.result()
    assert first.status_code == 201, first.text
    assert waiter.status_code == 201, waiter.text
    assert waited > 4.5  # it really waited for the holder (5.5 s of its hold were left)
    assert httpx.get(server.url + "/orders", timeout=10).json()["count"] == 2
    assert "Traceback" not in server.log_text()


@pytest.mark.e2e
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_database_busy_past_the_bound_is_a_503_problem_on_every_orderhub(
    demo_servers: Callable[..., DemoServer], tmp_path: Path, framework: str
) -> None:
    """Another process holds the write lock longer than ``?busy_timeout=1``: a keyless write and
    a new key get ``503`` problem+json with ``Retry-After`` (never a 500), reads and replays
    are answered, and both writes go through once the lock is free."""
    path = tmp_path / "store.db"
    server = _hub(demo_servers, f"sqlite:///{path}?busy_timeout=1", framework)
    base, keyed = server.url, {**ALICE, "Idempotency-Key": '"done"'}
    done = httpx.post(base + "/payments", json=PAYMENT, headers=keyed, timeout=30)
    assert done.status_code == 201, done.text
    with holding(path) as holder:
        keyless = httpx.post(base + "/orders", json=ORDER, timeout=30)
        fresh = httpx.post(
            base + "/payments", json=PAYMENT, headers={**ALICE, "Idempotency-Key": '"new"'},
            timeout=30,
        )  # fmt: skip
        replay = httpx.post(base + "/payments", json=PAYMENT, headers=keyed, timeout=30)
        listing = httpx.get(base + "/payments", timeout=30)
        assert holder.still_holds()
    assert keyless.status_code == 503, keyless.text
    assert _problem(keyless) == "database-unavailable"
    assert fresh.status_code == 503, fresh.text
    assert _problem(fresh) in ("idempotency-store-unavailable", "database-unavailable")
    for response in (keyless, fresh):
        assert int(response.headers["retry-after"]) >= 1
    if framework == "django" and replay.status_code == 503:
        # The Django ORM store begins every reservation with an upsert, so on SQLite even a
        # replay waits for the writer (then a 503 problem, never a 500); the URL stores read.
        assert int(replay.headers["retry-after"]) >= 1 and _problem(replay)
    else:
        assert replay.status_code == 201 and replay.headers["idempotency-replayed"] == "true"
    assert listing.status_code == 200 and listing.json()["count"] == 1
    again = httpx.post(
        base + "/payments", json=PAYMENT, headers={**ALICE, "Idempotency-Key": '"new"'}, timeout=30
    )
    assert again.status_code == 201 and "idempotency-replayed" not in again.headers
    assert httpx.post(base + "/orders", json=ORDER, timeout=30).status_code == 201
    assert "Traceback" not in server.log_text()
