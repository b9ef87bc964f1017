"""Metrics and spans on the synchronous fronts: the plain WSGI middleware and Flask, through the
one store ``wire()`` returns (its sync face), on real SQLite and Redis stores."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask, request
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from werkzeug.test import Client

from retrysafe import ConfigurationError
from retrysafe.asgi import IdempotencyMiddleware as AsgiMiddleware
from retrysafe.contrib.flask import Idempotency, idempotent, transaction
from retrysafe.contrib.otel import OpenTelemetryTracing
from retrysafe.contrib.prometheus import PrometheusMetrics
from retrysafe.stores import AsyncSQLiteStore, SQLiteStore
from retrysafe.stores.redis import AsyncRedisStore, RedisStore
from retrysafe.wsgi import IdempotencyMiddleware

from ..conftest import RUN_ID
from ..integrations.helpers import client_for, key

_prefixes = itertools.count(1)


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Any) -> tuple[str, str]:
    """``(store URL, its metric label)`` on a real SQLite file and a real Redis server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/store.db", "sqlite"
    url = request.getfixturevalue("redis_url")
    return f"{url}?prefix=rs-metrics-{RUN_ID}-{next(_prefixes)}:", "redis"


def _created(environ: Any, start_response: Any) -> list[bytes]:
    environ["wsgi.input"].read()
    start_response("201 Created", [("Content-Type", "application/json")])
    return [b'{"ok": true}']


def _flask_app(**wired: Any) -> Flask:
    app = Flask(__name__)
    Idempotency(app, **wired)

    @app.post("/orders/<int:order_id>")
    @idempotent(required=True)
    def pay(order_id: int) -> tuple[dict[str, Any], int]:
        return {"id": order_id, **(request.get_json() or {})}, 201

    return app


@pytest.fixture
def closing() -> Iterator[Callable[[Any], Any]]:
    """``closing(store)``: closed at the end of the test (the sync face a front resolved)."""
    stores: list[Any] = []
    yield stores.append
    for store in stores:
        store.close()


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.metrics = PrometheusMetrics(registry=self.registry)

    def value(self, name: str, **labels: str) -> float:
        found = self.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found


def test_wsgi_middleware_counts_requests_and_times_the_store(
    store_url: tuple[str, str], closing: Callable[[Any], Any]
) -> None:
    url, label = store_url
    m = Metrics()
    app = IdempotencyMiddleware(_created, **m.metrics.wire(url))
    closing(app.store)
    client = Client(app)
    first = client.post("/orders", data=b"{}", headers=key("w1"))
    again = client.post("/orders", data=b"{}", headers=key("w1"))
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.headers["Idempotency-Replayed"] == "true"
    seconds = "retrysafe_store_operation_seconds_count"
    assert m.value(seconds, operation="reserve", store=label) == 2
    assert m.value(seconds, operation="complete", store=label) == 1
    requests = "retrysafe_requests_total"
    assert m.value(requests, outcome="executed", route="unmatched", store=label) == 1
    assert m.value(requests, outcome="replayed", route="unmatched", store=label) == 1


def test_flask_extension_counts_by_view_rule_and_times_the_store(
    store_url: tuple[str, str], closing: Callable[[Any], Any]
) -> None:
    url, label = store_url
    m = Metrics()
    app = _flask_app(**m.metrics.wire(url))
    closing(Idempotency.state(app).store)
    client = app.test_client()
    assert client.post("/orders/7", json={"n": 1}, headers=key("f1")).status_code == 201
    replay = client.post("/orders/7", json={"n": 1}, headers=key("f1"))
    assert replay.headers["Idempotency-Replayed"] == "true"
    assert client.post("/orders/7", json={"n": 2}, headers=key("f1")).status_code == 422
    assert client.post("/orders/7", json={"n": 1}).status_code == 400
    seconds = "retrysafe_store_operation_seconds_count"
    assert m.value(seconds, operation="reserve", store=label) == 3
    assert m.value(seconds, operation="complete", store=label) == 1
    route = "/orders/<int:order_id>"  # the view's rule, never the path
    for outcome in ("executed", "replayed", "mismatch", "missing_key"):
        labels = {"outcome": outcome, "route": route, "store": label}
        assert m.value("retrysafe_requests_total", **labels) == 1, outcome


def test_flask_transactional_mode_times_begin_and_commit(
    tmp_path: Any, closing: Callable[[Any], Any]
) -> None:
    m = Metrics()
    app = Flask(__name__)
    Idempotency(app, **m.metrics.wire(f"sqlite:///{tmp_path}/tx.db"), transactional=True)
    closing(Idempotency.state(app).store)

    @app.post("/orders/<int:order_id>")
    def pay(order_id: int) -> tuple[dict[str, Any], int]:
        transaction().execute("CREATE TABLE IF NOT EXISTS paid (id INTEGER)")
        transaction().execute("INSERT INTO paid VALUES (?)", (order_id,))
        return {"id": order_id}, 201

    assert app.test_client().post("/orders/1", json={}, headers=key("t1")).status_code == 201
    seconds = "retrysafe_store_operation_seconds_count"
    for operation in ("reserve", "begin", "commit"):
        assert m.value(seconds, operation=operation, store="sqlite") == 1, operation


def test_flask_and_wsgi_store_operations_are_spans(
    store_url: tuple[str, str], closing: Callable[[Any], Any]
) -> None:
    url, label = store_url
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = OpenTelemetryTracing(tracer_provider=provider)
    app = _flask_app(**tracing.wire(url))
    closing(Idempotency.state(app).store)
    server = provider.get_tracer("server")
    with server.start_as_current_span("POST /orders/3") as request_span:
        assert app.test_client().post("/orders/3", json={}, headers=key("o1")).status_code == 201
    wsgi = IdempotencyMiddleware(_created, **tracing.wire(url))
    closing(wsgi.store)
    assert Client(wsgi).post("/x", data=b"{}", headers=key("o2")).status_code == 201
    spans = exporter.get_finished_spans()
    stored = [s for s in spans if s.name.startswith("retrysafe.")]
    assert sorted(s.name for s in stored) == ["retrysafe.complete"] * 2 + ["retrysafe.reserve"] * 2
    assert {dict(s.attributes or {})["db.system.name"] for s in stored} == {label}
    flask_reserve = next(s for s in stored if s.name == "retrysafe.reserve")
    assert flask_reserve.parent is not None
    assert flask_reserve.parent.span_id == request_span.get_span_context().span_id
    attributes = dict(next(s for s in spans if s.name == "POST /orders/3").attributes or {})
    assert attributes["idempotency.outcome"] == "executed"
    assert attributes["idempotency.route"] == "/orders/<int:order_id>"


def test_one_wired_store_serves_asgi_and_wsgi_into_the_same_metrics(tmp_path: Any) -> None:
    m = Metrics()
    wired = m.metrics.wire(SQLiteStore(f"{tmp_path}/both.db"))
    wsgi = IdempotencyMiddleware(_created, **wired)
    assert Client(wsgi).post("/x", data=b"{}", headers=key("b1")).status_code == 201
    # The ASGI face wraps the very same SQLite store: the key is taken there too.
    asgi = AsgiMiddleware(
        Starlette(routes=[Route("/x", lambda r: JSONResponse({}, 201), methods=["POST"])]),
        **wired,
    )

    async def replay() -> str:
        async with client_for(asgi) as client:
            return str((await client.post("/x", content=b"{}", headers=key("b1"))).headers)

    assert "'idempotency-replayed': 'true'" in asyncio.run(replay()).lower()
    seconds = "retrysafe_store_operation_seconds_count"
    assert m.value(seconds, operation="reserve", store="sqlite") == 2
    wsgi.store.close()


def test_an_async_store_object_of_a_local_store_serves_wsgi_too(tmp_path: Any) -> None:
    m = Metrics()
    wsgi = IdempotencyMiddleware(_created, **m.metrics.wire(AsyncSQLiteStore(f"{tmp_path}/a.db")))
    assert Client(wsgi).post("/x", data=b"{}", headers=key("l1")).status_code == 201
    assert m.value("retrysafe_store_operation_seconds_count", operation="reserve", store="sqlite")
    wsgi.store.close()


def test_an_async_network_store_object_has_no_sync_face_and_the_error_names_the_fix(
    redis_url: str,
) -> None:
    m = Metrics()
    wired = m.metrics.wire(AsyncRedisStore.from_url(f"{redis_url}?prefix=rs-metrics-{RUN_ID}-a:"))
    with pytest.raises(ConfigurationError) as raised:
        IdempotencyMiddleware(_created, **wired)
    message = str(raised.value)
    assert message.startswith("IdempotencyMiddleware(store=...): ")
    assert "AsyncRedisStore, an async store object" in message
    assert "give wire() (or instrument()) the store URL or a synchronous store" in message
    with pytest.raises(ConfigurationError, match=r"^Idempotency\(store=...\): .*store URL"):
        _flask_app(**wired)


def test_a_sync_network_store_object_is_wired_for_wsgi_and_refused_by_asgi_by_name(
    redis_url: str, closing: Callable[[Any], Any]
) -> None:
    m = Metrics()
    store = RedisStore.from_url(f"{redis_url}?prefix=rs-metrics-{RUN_ID}-obj:")
    closing(store)
    wired = m.metrics.wire(store)
    assert (
        Client(IdempotencyMiddleware(_created, **wired))
        .post("/x", data=b"{}", headers=key("r1"))
        .status_code
        == 201
    )
    assert m.value("retrysafe_store_operation_seconds_count", operation="reserve", store="redis")
    with pytest.raises(ConfigurationError) as raised:
        AsgiMiddleware(_created, **wired)
    message = str(raised.value)
    assert "RedisStore, a synchronous store object" in message
    assert "the store URL or an async store" in message


def test_prometheus_and_otel_wrappers_nest_on_wsgi(tmp_path: Any) -> None:
    m = Metrics()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = OpenTelemetryTracing(tracer_provider=provider)
    store = tracing.instrument(m.metrics.instrument(f"sqlite:///{tmp_path}/n.db"))
    app = IdempotencyMiddleware(_created, store=store)
    assert callable(getattr(app.store, "begin", None))  # a SQL store through both wrappers
    assert Client(app).post("/x", data=b"{}", headers=key("n1")).status_code == 201
    names = sorted(s.name for s in exporter.get_finished_spans())
    assert names == ["retrysafe.complete", "retrysafe.reserve"]
    seconds = "retrysafe_store_operation_seconds_count"
    assert m.value(seconds, operation="reserve", store="sqlite") == 1
    assert m.value(seconds, operation="complete", store="sqlite") == 1
    app.store.close()
