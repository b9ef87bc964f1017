"""retrysafe.contrib.otel with the OpenTelemetry SDK's in-memory exporter, in real Starlette."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import retrysafe
from retrysafe.asgi import IdempotencyMiddleware
from retrysafe.contrib.otel import OpenTelemetryTracing
from retrysafe.stores import AsyncMemoryStore, AsyncSQLiteStore

from ..integrations.helpers import client_for, key


class Traced:
    """An app behind retrysafe, behind a server-like middleware that opens the request span."""

    def __init__(self, store: Any, handler: Any = None, **options: Any) -> None:
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracing = OpenTelemetryTracing(tracer_provider=provider)
        tracer = provider.get_tracer("server")

        async def create(request: Request) -> Response:
            return JSONResponse({"ok": True}, 201)

        routes = [Route("/orders/{shop}", handler or create, methods=["POST"])]
        middleware = Middleware(IdempotencyMiddleware, **self.tracing.wire(store), **options)
        inner = Starlette(routes=routes, middleware=[middleware])

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                await inner(scope, receive, send)
                return
            with tracer.start_as_current_span("POST request", kind=SpanKind.SERVER):
                await inner(scope, receive, send)

        self.app = app

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def requests(self) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == "POST request"]


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def test_store_operations_are_child_spans_and_the_request_span_has_the_outcome() -> None:
    t = Traced(AsyncMemoryStore())
    async with client_for(t.app) as client:
        assert (await client.post("/orders/7", headers=key("secret-key-1"))).status_code == 201
        replay = await client.post("/orders/7", headers=key("secret-key-1"))
        assert replay.headers["idempotency-replayed"] == "true"
    first, second = t.requests()
    by_parent: dict[int, list[str]] = {}
    for span in t.spans():
        if span.parent is not None:
            by_parent.setdefault(span.parent.span_id, []).append(span.name)
    assert sorted(by_parent[first.context.span_id]) == ["retrysafe.complete", "retrysafe.reserve"]
    assert by_parent[second.context.span_id] == ["retrysafe.reserve"]
    reserve = next(s for s in t.spans() if s.name == "retrysafe.reserve")
    assert _attrs(reserve)["db.system.name"] == "memory"
    assert reserve.kind is SpanKind.CLIENT
    a, b = _attrs(first), _attrs(second)
    assert a["idempotency.outcome"] == "executed" and a["idempotency.replayed"] is False
    assert b["idempotency.outcome"] == "replayed" and b["idempotency.replayed"] is True
    assert a["idempotency.record"] == b["idempotency.record"]
    assert a["idempotency.route"] == "/orders/{shop}"
    # The record attribute is a hash prefix: the key is in no attribute of any span.
    for span in t.spans():
        assert all("secret-key-1" not in str(v) for v in _attrs(span).values())


async def test_conflict_and_mismatch_outcomes() -> None:
    gate = asyncio.Event()
    entered = asyncio.Event()

    async def slow(request: Request) -> Response:
        entered.set()
        await gate.wait()
        return JSONResponse({}, 201)

    t = Traced(AsyncMemoryStore(), slow)
    async with client_for(t.app) as client:
        first = asyncio.create_task(client.post("/orders/1", headers=key("k")))
        await asyncio.wait_for(entered.wait(), 5)
        assert (await client.post("/orders/1", headers=key("k"))).status_code == 409
        gate.set()
        await first
        assert (await client.post("/orders/1", headers=key("k"), content=b"x")).status_code == 422
    outcomes = [_attrs(s)["idempotency.outcome"] for s in t.requests()]
    assert sorted(outcomes) == ["executed", "in_progress", "mismatch"]


async def test_failed_store_operation_is_an_error_span_with_the_exception() -> None:
    from retrysafe.stores.redis import AsyncRedisStore

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    t = Traced(AsyncRedisStore(f"redis://127.0.0.1:{port}/0?timeout=1&connect_timeout=0.5"))
    async with client_for(t.app) as client:
        assert (await client.post("/orders/1", headers=key("k"))).status_code == 503
    reserve = next(s for s in t.spans() if s.name == "retrysafe.reserve")
    assert reserve.status.status_code is StatusCode.ERROR
    assert any(e.name == "exception" for e in reserve.events)
    assert _attrs(reserve)["db.system.name"] == "redis"
    (request,) = t.requests()
    assert _attrs(request)["idempotency.outcome"] == "store_unavailable"


async def test_outcome_unknown_is_a_span_event(tmp_path: Path) -> None:
    async def effect_then_fail(request: Request) -> Response:
        assert await retrysafe.mark_committed(request)
        return Response(status_code=500)

    t = Traced(AsyncSQLiteStore(f"{tmp_path}/s.db"), effect_then_fail)
    async with client_for(t.app) as client:
        assert (await client.post("/orders/1", headers=key("u"))).status_code == 500
        retry = await client.post("/orders/1", headers=key("u"))
    assert retry.status_code == 409
    assert retry.json()["code"] == "idempotency_outcome_unknown"
    first, second = t.requests()
    declared = [e for e in first.events if e.name == "retrysafe.outcome_unknown"]
    assert [dict(e.attributes or {}) for e in declared] == [{"phase": "declared"}]
    assert _attrs(second)["idempotency.outcome"] == "outcome_unknown"
    assert any(s.name == "retrysafe.mark_committed" for s in t.spans())


async def test_lease_lost_during_the_handler_lands_on_its_request_span() -> None:
    store = AsyncMemoryStore()
    entered = asyncio.Event()
    gate = asyncio.Event()

    async def slow(request: Request) -> Response:
        entered.set()
        await gate.wait()
        return JSONResponse({}, 201)

    t = Traced(store, slow, lease=0.3)
    async with client_for(t.app) as client:
        first = asyncio.create_task(client.post("/orders/1", headers=key("l")))
        await asyncio.wait_for(entered.wait(), 5)
        # Another process takes the key over: every record of this store is deleted.
        for record_id in list(store.sync._entries):
            await store.delete(record_id)
        await store.reserve(record_id, "other", lease=30, ttl=60)
        for _ in range(100):  # the next renewal (every lease / 3) finds the lease gone
            if any(s.name == "retrysafe.renew" for s in t.spans()):
                break
            await asyncio.sleep(0.02)
        gate.set()
        await first
    (request,) = t.requests()
    lost = [e for e in request.events if e.name == "retrysafe.lease_lost"]
    assert [dict(e.attributes or {}) for e in lost] == [{"phase": "renew"}]
    assert request.status.status_code is StatusCode.ERROR
    # The renewal is background work: a trace of its own, not a child of a request.
    renew = next(s for s in t.spans() if s.name == "retrysafe.renew")
    assert renew.parent is None


async def test_transactional_mode_begin_and_commit_are_spans(tmp_path: Path) -> None:
    async def create(request: Request) -> Response:
        conn = await retrysafe.transaction(request)
        conn.execute("CREATE TABLE IF NOT EXISTS t (x)")
        conn.execute("INSERT INTO t VALUES (1)")
        return JSONResponse({}, 201)

    t = Traced(AsyncSQLiteStore(f"{tmp_path}/t.db"), create, transactional=True)
    async with client_for(t.app) as client:
        assert (await client.post("/orders/1", headers=key("t"))).status_code == 201
    names = sorted(s.name for s in t.spans() if s.name.startswith("retrysafe."))
    assert names == ["retrysafe.begin", "retrysafe.commit", "retrysafe.reserve"]


async def test_prometheus_and_otel_wrappers_nest_and_both_observe(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    from retrysafe.contrib.prometheus import PrometheusMetrics

    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry=registry)
    t = Traced(AsyncMemoryStore())  # for its exporter and tracing object
    store = t.tracing.instrument(metrics.instrument(AsyncSQLiteStore(f"{tmp_path}/n.db")))
    assert callable(getattr(store, "begin", None))  # still a SQL store, through both wrappers
    count = metrics.event_hook("sqlite")

    def both(event: str, details: Any) -> None:
        count(event, details)
        t.tracing.on_event(event, details)

    app = IdempotencyMiddleware(
        Starlette(routes=[Route("/x", lambda r: JSONResponse({}, 201), methods=["POST"])]),
        store=store,
        on_event=both,
    )
    async with client_for(app) as client:
        assert (await client.post("/x", headers=key("n"))).status_code == 201
    assert sorted(s.name for s in t.spans()) == ["retrysafe.complete", "retrysafe.reserve"]
    reserve = next(s for s in t.spans() if s.name == "retrysafe.reserve")
    assert _attrs(reserve)["db.system.name"] == "sqlite"
    labels = {"operation": "reserve", "store": "sqlite"}
    assert registry.get_sample_value("retrysafe_store_operation_seconds_count", labels) == 1
    # The middleware wraps the Starlette app: its routes are found through the app it wraps.
    executed = {"outcome": "executed", "route": "/x", "store": "sqlite"}
    assert registry.get_sample_value("retrysafe_requests_total", executed) == 1
