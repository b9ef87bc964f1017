"""OrderHub as 3 real processes sharing one PostgreSQL store (an isolated table of this run).

The orders themselves live in one shared SQLite file (the demo's data is SQLite for now). The
shared PostgreSQL server is never stopped: connection loss is simulated by terminating only the
demo processes' own backends, found by the application_name their store URL sets.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from ..stores.backend_postgres import admin_connect, fresh_table_url
from .servers import DemoServer

pytestmark = pytest.mark.e2e

AUTH = {"Authorization": "Bearer alice"}


def _key() -> str:
    return f'"{uuid.uuid4()}"'


def _start(
    request: pytest.FixtureRequest,
    demo_servers: Callable[..., DemoServer],
    tmp_path: Path,
    application_name: str,
) -> tuple[str, list[DemoServer]]:
    url = fresh_table_url(request, application_name=application_name, max_size="5")
    db = f"sqlite:///{tmp_path}/orders.db"
    return url, [demo_servers(url, db=db) for _ in range(3)]


async def test_60_same_key_posts_across_3_processes_make_one_order(
    request: pytest.FixtureRequest, demo_servers: Callable[..., DemoServer], tmp_path: Path
) -> None:
    _, servers = _start(request, demo_servers, tmp_path, f"rs-e2e-{uuid.uuid4().hex[:8]}")
    key = _key()
    body = {"item": "book", "quantity": 1}
    async with httpx.AsyncClient(timeout=30) as client:
        answers = await asyncio.gather(
            *(
                client.post(
                    servers[n % 3].url + "/orders?delay_ms=200",
                    json=body,
                    headers={**AUTH, "Idempotency-Key": key},
                )
                for n in range(60)
            )
        )
        statuses = Counter(a.status_code for a in answers)
        assert set(statuses) <= {201, 409}, statuses
        created = [a for a in answers if a.status_code == 201]
        assert created, statuses
        assert len({a.json()["id"] for a in created}) == 1
        # Every 409 is "in progress" and says when to come back.
        assert all("retry-after" in a.headers for a in answers if a.status_code == 409)
        # Once the first finished, a retry anywhere is the replay of the same order.
        replay = await client.post(
            servers[2].url + "/orders?delay_ms=200",
            json=body,
            headers={**AUTH, "Idempotency-Key": key},
        )
        assert replay.status_code == 201
        assert replay.headers.get("idempotency-replayed") == "true"
        assert replay.json()["id"] == created[0].json()["id"]
        listing = (await client.get(servers[0].url + "/orders")).json()
    assert listing["count"] == 1


def _killer(url: str, application_name: str, stop: threading.Event, kills: list[int]) -> None:
    """Terminate the demos' PostgreSQL backends every 150 ms until told to stop."""
    while not stop.wait(0.15):
        with admin_connect(url) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (application_name,),
            ).fetchall()
        kills.append(len(rows))


async def test_connection_loss_mid_run_gives_503_or_success_never_500_or_a_duplicate(
    request: pytest.FixtureRequest, demo_servers: Callable[..., DemoServer], tmp_path: Path
) -> None:
    name = f"rs-e2e-fault-{uuid.uuid4().hex[:8]}"
    url, servers = _start(request, demo_servers, tmp_path, name)
    keys = [_key() for _ in range(120)]
    seen: Counter[int] = Counter()
    stop = threading.Event()
    kills: list[int] = []
    killer = threading.Thread(target=_killer, args=(url, name, stop, kills))

    async with httpx.AsyncClient(timeout=30) as client:

        async def send(n: int, key: str) -> httpx.Response:
            answer = await client.post(
                servers[n % 3].url + "/orders?delay_ms=20",
                json={"item": key, "quantity": 1},
                headers={**AUTH, "Idempotency-Key": key},
            )
            seen[answer.status_code] += 1
            if answer.status_code == 503:
                assert answer.headers.get("retry-after"), answer.headers
            return answer

        killer.start()
        try:
            # Each key twice at once (a double click) during the faults; 503 is retried.
            for round_ in range(3):
                answers = await asyncio.gather(
                    *(send(n + round_, key) for n, key in enumerate(keys) for _ in range(2))
                )
                assert all(a.status_code in {201, 409, 503} for a in answers), Counter(
                    a.status_code for a in answers
                )
                await asyncio.sleep(0.1)
        finally:
            stop.set()
            killer.join()
        assert sum(kills) > 0, "the fault never hit a backend"
        assert seen[500] == 0

        # After the faults: every key gets its answer (first run or replay); fresh keys work.
        final: dict[str, int] = {}
        for n, key in enumerate(keys):
            for _ in range(20):
                answer = await send(n, key)
                if answer.status_code != 503:
                    break
                await asyncio.sleep(0.1)
            final[key] = answer.status_code
        fresh = [await send(n, _key()) for n in range(6)]
        assert all(a.status_code == 201 for a in fresh)
        # 409 remains possible only for a key whose completion was lost with its connection
        # (in progress until its 30 s lease lapses); it must never have run twice.
        assert set(final.values()) <= {201, 409}, Counter(final.values())
        assert Counter(final.values())[201] >= len(keys) * 0.9
        listing = (await client.get(servers[0].url + "/orders")).json()
    items = Counter(order["item"] for order in listing["orders"])
    duplicates = {item: count for item, count in items.items() if count > 1}
    assert not duplicates
    print(f"answers during and after the faults: {dict(seen)}; backends terminated: {sum(kills)}")
