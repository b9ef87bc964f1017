"""OrderHub on PostgreSQL (store and orders in one database, transactional mode) as two real
processes while their backends are terminated under load (issue 15): answers during the faults
are successes or 503s, every request after recovery succeeds, and the servers' logs never show
a pooled connection used mid-operation."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from collections.abc import Callable

import httpx
import pytest

from ..stores.backend_postgres import SCHEMA, admin_connect, fresh_table_url, with_options
from .servers import DemoServer

pytestmark = pytest.mark.e2e

BAD_STATE = ("another operation", "cannot switch to state", "cannot perform operation")


async def test_terminated_backends_under_load_then_every_request_succeeds(
    request: pytest.FixtureRequest, demo_servers: Callable[..., DemoServer]
) -> None:
    name = f"rs-pool-e2e-{uuid.uuid4().hex[:8]}"
    store = fresh_table_url(request, application_name=name, max_size="4")
    orders_schema = f"{SCHEMA}_pool_{uuid.uuid4().hex[:6]}"
    # The orders' own pool carries the same application_name, so the faults hit it too.
    db = with_options(store.split("?", 1)[0], schema=orders_schema, application_name=name)

    def drop() -> None:
        with admin_connect(store) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{orders_schema}" CASCADE')

    request.addfinalizer(drop)
    servers = [demo_servers(store, db=db) for _ in range(2)]
    stop = threading.Event()
    kills: list[int] = []

    def killer() -> None:
        with admin_connect(store) as conn:
            while not stop.wait(0.1):
                rows = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s",
                    (name,),
                ).fetchall()
                kills.append(len(rows))

    seen: Counter[int] = Counter()
    limits = httpx.Limits(max_connections=40)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:

        async def send(n: int, keyed: bool) -> httpx.Response:
            headers = {"Authorization": "Bearer alice"}
            if keyed:
                headers["Idempotency-Key"] = f'"{uuid.uuid4()}"'
            answer = await client.post(
                servers[n % 2].url + "/orders?delay_ms=5",
                json={"item": "book", "quantity": 1},
                headers=headers,
            )
            seen[answer.status_code] += 1
            if answer.status_code == 503:
                assert answer.headers["content-type"] == "application/problem+json"
                assert int(answer.headers["retry-after"]) >= 1
            return answer

        thread = threading.Thread(target=killer)
        thread.start()
        try:
            for _ in range(4):
                await asyncio.gather(*(send(n, keyed=n % 4 != 0) for n in range(60)))
        finally:
            stop.set()
            thread.join(10)
        assert sum(kills) > 10, kills
        assert set(seen) <= {201, 503}, seen
        during = dict(seen)

        # After the faults: every request succeeds, keyed or not, one by one and at once.
        after = [await send(n, keyed=n % 2 == 0) for n in range(20)]
        after += await asyncio.gather(*(send(n, keyed=n % 3 != 0) for n in range(30)))
    assert [a.status_code for a in after] == [201] * len(after), [a.text for a in after]
    for server in servers:
        server.stop()
        log = server.log_text()
        assert "Traceback" not in log, log
        assert not [line for line in log.splitlines() if any(t in line for t in BAD_STATE)], log
    print(f"answers during the faults: {during}; backends terminated: {sum(kills)}")
