"""End to end with the Redis store: real ``retrysafe demo`` processes, real redis-servers.

Several instances sharing one Redis store and one orders database behave as one service; when
their Redis goes away they answer 503 with Retry-After (never 500, never a duplicate order) and
recover by themselves when it is back.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from ..stores.backend_redis import PrivateRedis, delete_prefixed, unique_prefix, with_prefix
from .servers import DemoServer

pytestmark = pytest.mark.e2e

ORDER = {"item": "espresso machine", "quantity": 1}


@pytest.fixture
def redis_store_url(redis_url: str) -> Iterator[str]:
    """A store URL on the shared Redis under a prefix of this test's own (deleted after)."""
    prefix = unique_prefix("e2e")
    yield with_prefix(redis_url, prefix)
    delete_prefixed(redis_url, prefix)


async def _post(client: httpx.AsyncClient, base: str, key: str) -> httpx.Response:
    return await client.post(f"{base}/orders", json=ORDER, headers={"Idempotency-Key": f'"{key}"'})


async def _order_count(client: httpx.AsyncClient, base: str) -> int:
    response = await client.get(f"{base}/orders?limit=0")
    assert response.status_code == 200
    count: int = response.json()["count"]
    return count


async def test_60_same_key_posts_across_3_instances_make_one_order(
    demo_servers: Callable[..., DemoServer], redis_store_url: str, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'orders.db'}"
    servers = [demo_servers(redis_store_url, db=db) for _ in range(3)]
    key = str(uuid.uuid4())
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(timeout=30.0, limits=limits) as client:
        bases = itertools.cycle(s.url for s in servers)
        responses = await asyncio.gather(*(_post(client, next(bases), key) for _ in range(60)))
        statuses = sorted({r.status_code for r in responses})
        assert set(statuses) <= {201, 409}, statuses
        created = [r for r in responses if r.status_code == 201]
        executed = [r for r in created if r.headers.get("idempotency-replayed") != "true"]
        assert len(executed) == 1
        assert len({r.json()["id"] for r in created}) == 1
        for r in responses:
            if r.status_code == 409:
                assert int(r.headers["retry-after"]) >= 1
        # Every instance now replays the one stored answer.
        for server in servers:
            replay = await _post(client, server.url, key)
            assert replay.status_code == 201
            assert replay.headers["idempotency-replayed"] == "true"
            assert replay.json()["id"] == executed[0].json()["id"]
        for server in servers:
            assert await _order_count(client, server.url) == 1


async def test_redis_down_mid_run_answers_503_and_recovers(
    demo_servers: Callable[..., DemoServer], tmp_path: Path
) -> None:
    redis_server = PrivateRedis(tmp_path / "redis").start()
    try:
        store = f"{redis_server.url}?prefix=e2e:&connect_timeout=1&timeout=1"
        server = demo_servers(store, db=f"sqlite:///{tmp_path / 'orders.db'}")
        outcomes: dict[str, int] = {}
        counter = itertools.count()
        stop = asyncio.Event()

        async def traffic(client: httpx.AsyncClient) -> None:
            # A steady stream of new-key POSTs; each key is sent exactly once.
            while not stop.is_set():
                key = f"k-{next(counter)}"
                response = await _post(client, server.url, key)
                outcomes[key] = response.status_code
                assert response.status_code in {201, 503}, response.text
                if response.status_code == 503:
                    assert int(response.headers["retry-after"]) >= 1
                    assert response.headers["content-type"].startswith("application/problem+json")

        async with httpx.AsyncClient(timeout=30.0) as client:
            first = await _post(client, server.url, "before")
            assert first.status_code == 201
            workers = [asyncio.create_task(traffic(client)) for _ in range(8)]
            await asyncio.sleep(0.5)
            redis_server.stop()  # mid-run: requests are in flight
            await asyncio.sleep(1.0)
            down = await _post(client, server.url, "while-down")
            assert down.status_code == 503 and "retry-after" in down.headers
            replay_down = await _post(client, server.url, "before")
            assert replay_down.status_code == 503  # fail closed: never run a maybe-duplicate
            redis_server.start()  # the same port: the instance must reconnect by itself
            await asyncio.sleep(0.5)
            stop.set()
            await asyncio.gather(*workers)

            # No 500 anywhere, and no duplicate: orders are exactly the 201s (each key sent once).
            created = sum(1 for status in outcomes.values() if status == 201)
            assert 503 in outcomes.values() and created > 0
            assert await _order_count(client, server.url) == 1 + created

            # Recovered: keys that got 503 ran nothing, so their retries run now, once each.
            refused = [key for key, status in outcomes.items() if status == 503][:20]
            for key in [*refused, "while-down"]:
                again = await _post(client, server.url, key)
                assert again.status_code == 201
                assert again.headers.get("idempotency-replayed") is None
                replay = await _post(client, server.url, key)
                assert replay.headers["idempotency-replayed"] == "true"
            assert await _order_count(client, server.url) == 1 + created + len(refused) + 1
    finally:
        redis_server.stop()
