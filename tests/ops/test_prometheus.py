"""retrysafe.contrib.prometheus in a real Starlette app, read back from its own registry."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import retrysafe
from retrysafe import idempotent
from retrysafe.asgi import IdempotencyMiddleware
from retrysafe.contrib.prometheus import METRIC_NAMES, OUTCOMES, PrometheusMetrics
from retrysafe.stores import AsyncMemoryStore, AsyncSQLiteStore

from ..integrations.helpers import REPLAYED, client_for, key


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # nothing listens on it once the socket is closed


class Harness:
    def __init__(self, store: Any, **options: Any) -> None:
        self.registry = CollectorRegistry()
        self.metrics = PrometheusMetrics(registry=self.registry)
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()

        async def create(request: Request) -> Response:
            self.entered.set()
            await self.release.wait()
            return JSONResponse({"ok": True}, 201)

        @idempotent(required=True)
        async def update(request: Request) -> Response:
            return JSONResponse({"id": request.path_params["order_id"]})

        routes = [
            Route("/orders", create, methods=["POST"]),
            Route("/orders/{order_id:int}", update, methods=["PATCH"]),
        ]
        wired = self.metrics.wire(store)
        # Inside Starlette, so scope["app"] (its routes: templates, per-route options) is set.
        middleware = Middleware(IdempotencyMiddleware, max_body_size=64, **wired, **options)
        self.app = Starlette(routes=routes, middleware=[middleware])

    def value(self, name: str, **labels: str) -> float:
        found = self.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found

    def outcome(self, outcome: str, route: str = "/orders", store: str = "memory") -> float:
        return self.value("retrysafe_requests_total", outcome=outcome, route=route, store=store)


async def test_each_outcome_is_counted_once_by_route_template_and_store() -> None:
    h = Harness(AsyncMemoryStore())
    async with client_for(h.app) as client:
        assert (await client.post("/orders", headers=key("a"), content=b"{}")).status_code == 201
        replay = await client.post("/orders", headers=key("a"), content=b"{}")
        assert replay.headers[REPLAYED] == "true"
        assert (await client.post("/orders", headers=key("a"), content=b"[]")).status_code == 422
        bad = await client.post("/orders", headers={"Idempotency-Key": ""}, content=b"{}")
        assert bad.status_code == 400
        big = await client.post("/orders", headers=key("b"), content=b"x" * 65)
        assert big.status_code == 413
        assert (await client.patch("/orders/7", content=b"{}")).status_code == 400
        assert (await client.patch("/orders/7", headers=key("c"))).status_code == 200
        assert (await client.patch("/orders/8", headers=key("c"))).status_code == 200
        # No key on an optional route: not a keyed request, not counted.
        assert (await client.post("/orders", content=b"{}")).status_code == 201
    assert h.outcome("executed") == 1
    assert h.outcome("replayed") == 1
    assert h.outcome("mismatch") == 1
    assert h.outcome("invalid_key") == 1
    assert h.outcome("too_large") == 1
    # Labelled by the template, never the raw path: /orders/7 and /orders/8 are one series.
    assert h.outcome("missing_key", route="/orders/{order_id}") == 1
    assert h.outcome("executed", route="/orders/{order_id}") == 2
    assert (
        h.value("retrysafe_requests_total", outcome="executed", route="/orders/7", store="memory")
        == 0
    )
    for metric in h.registry.collect():
        for sample in metric.samples:
            assert "/orders/7" not in sample.labels.values()
            assert "/orders/8" not in sample.labels.values()
    assert h.value("retrysafe_in_flight_requests", route="/orders", store="memory") == 0


async def test_in_flight_gauge_and_conflicts_while_a_handler_runs() -> None:
    h = Harness(AsyncMemoryStore())
    h.release.clear()
    async with client_for(h.app) as client:
        first = asyncio.create_task(client.post("/orders", headers=key("slow"), content=b"{}"))
        await asyncio.wait_for(h.entered.wait(), 5)
        assert h.value("retrysafe_in_flight_requests", route="/orders", store="memory") == 1
        dup = await client.post("/orders", headers=key("slow"), content=b"{}")
        assert dup.status_code == 409
        h.release.set()
        assert (await first).status_code == 201
    assert h.outcome("in_progress") == 1
    assert h.outcome("executed") == 1
    assert h.value("retrysafe_in_flight_requests", route="/orders", store="memory") == 0


async def test_store_latency_is_observed_per_operation() -> None:
    h = Harness(AsyncMemoryStore())
    async with client_for(h.app) as client:
        for i in range(3):
            await client.post("/orders", headers=key(f"k{i}"), content=b"{}")
        await client.post("/orders", headers=key("k0"), content=b"{}")  # a replay: reserve only
    count = "retrysafe_store_operation_seconds_count"
    assert h.value(count, operation="reserve", store="memory") == 4
    assert h.value(count, operation="complete", store="memory") == 3
    assert h.value("retrysafe_store_operation_seconds_sum", operation="reserve", store="memory") > 0
    assert h.value("retrysafe_store_errors_total", operation="reserve", store="memory") == 0


async def test_unreachable_store_counts_store_unavailable_and_the_failed_operation() -> None:
    from retrysafe.stores.redis import AsyncRedisStore

    url = f"redis://127.0.0.1:{_closed_port()}/0?timeout=1&connect_timeout=0.5"
    h = Harness(AsyncRedisStore(url))
    async with client_for(h.app) as client:
        answer = await client.post("/orders", headers=key("down"), content=b"{}")
    assert answer.status_code == 503
    assert answer.json()["code"] == "idempotency_store_unavailable"
    assert h.outcome("store_unavailable", store="redis") == 1
    assert h.outcome("executed", store="redis") == 0
    assert h.value("retrysafe_store_errors_total", operation="reserve", store="redis") == 1


async def test_fail_open_is_counted_as_fail_open_not_as_unavailable() -> None:
    from retrysafe.stores.redis import AsyncRedisStore

    url = f"redis://127.0.0.1:{_closed_port()}/0?timeout=1&connect_timeout=0.5"
    h = Harness(AsyncRedisStore(url), on_store_error="fail_open")
    async with client_for(h.app) as client:
        answer = await client.post("/orders", headers=key("open"), content=b"{}")
    assert answer.status_code == 201
    assert h.outcome("fail_open", store="redis") == 1
    assert h.outcome("store_unavailable", store="redis") == 0


async def test_transactional_mode_still_works_and_times_begin_and_commit(tmp_path: Path) -> None:
    store = AsyncSQLiteStore(f"{tmp_path}/tx.db")
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry=registry)
    wired = metrics.wire(store)
    assert callable(getattr(wired["store"], "begin", None))
    assert not hasattr(metrics.wire(AsyncMemoryStore())["store"], "begin")

    async def create(request: Request) -> Response:
        conn = await retrysafe.transaction(request)
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)")
        conn.execute("INSERT INTO orders DEFAULT VALUES")
        return JSONResponse({"ok": True}, 201)

    app = IdempotencyMiddleware(
        Starlette(routes=[Route("/orders", create, methods=["POST"])]),
        transactional=True,
        **wired,
    )
    async with client_for(app) as client:
        assert (await client.post("/orders", headers=key("t"))).status_code == 201
        replay = await client.post("/orders", headers=key("t"))
        assert replay.headers[REPLAYED] == "true"
    count = "retrysafe_store_operation_seconds_count"
    for operation, expected in (("reserve", 2), ("begin", 1), ("commit", 1), ("complete", 0)):
        found = registry.get_sample_value(count, {"operation": operation, "store": "sqlite"})
        assert (found or 0) == expected, operation
    conn = store.sync.open_connection()
    assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 1


def test_every_outcome_label_and_metric_name_is_published() -> None:
    registry = CollectorRegistry()
    PrometheusMetrics(registry=registry)
    names = {m.name for m in registry.collect()}
    # Counters are collected without their _total suffix.
    assert {n.removesuffix("_total") for n in METRIC_NAMES} == names
    assert set(OUTCOMES.values()) == {
        "executed",
        "replayed",
        "in_progress",
        "mismatch",
        "invalid_key",
        "missing_key",
        "too_large",
        "store_unavailable",
        "fail_open",
        "outcome_unknown",
        "lease_lost",
    }


def test_a_second_instance_on_one_registry_is_refused() -> None:
    registry = CollectorRegistry()
    PrometheusMetrics(registry=registry)
    with pytest.raises(ValueError, match="Duplicated"):
        PrometheusMetrics(registry=registry)


async def test_a_request_without_a_known_route_is_labelled_unmatched() -> None:
    """A bare ASGI app has no route table: the label is fixed, never the raw path."""
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry=registry)

    async def bare(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    app = IdempotencyMiddleware(bare, **metrics.wire("memory://"))
    async with client_for(app) as client:
        for path in ("/a/1", "/a/2"):
            assert (await client.post(path, headers=key(path))).status_code == 201
    labels = {"outcome": "executed", "route": "unmatched", "store": "memory"}
    assert registry.get_sample_value("retrysafe_requests_total", labels) == 2
