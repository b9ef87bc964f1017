"""Prometheus metrics and OpenTelemetry spans through ``settings.RETRYSAFE``: the one store
``wire()`` returns serves the sync and the async middleware stack (each takes its face), on real
SQLite, Redis and the Django ORM store."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from retrysafe.contrib.django.checks import check_settings
from retrysafe.contrib.otel import OpenTelemetryTracing
from retrysafe.contrib.prometheus import PrometheusMetrics

from .conftest import STORES, Api

#: SQLite, Redis and the Django ORM store (on SQLite).
METRIC_STORES = [
    p for p in STORES if getattr(p, "values", (p,))[0] in ("sqlite", "redis", "django")
]


@pytest.mark.parametrize("store", METRIC_STORES, indirect=True)
def test_settings_wired_metrics_count_requests_and_time_the_store(
    settings: Any, store: Any, client_kind: str
) -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry=registry)
    wired = metrics.wire(store)
    label = store.partition(":")[0]  # the backend: sqlite, redis, django
    settings.RETRYSAFE = {**wired, "TRANSACTIONAL": False}
    assert [e.id for e in check_settings() if e.id.startswith("retrysafe.E")] == []
    api = Api(client_kind)
    assert api.post("/orders/5", key="m1").status_code == 201
    replay = api.post("/orders/5", key="m1")
    assert replay["Idempotency-Replayed"] == "true"

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    seconds = "retrysafe_store_operation_seconds_count"
    assert value(seconds, operation="reserve", store=label) == 2
    assert value(seconds, operation="complete", store=label) == 1
    route = "/orders/<int:pk>"
    for outcome in ("executed", "replayed"):
        labels = {"outcome": outcome, "route": route, "store": label}
        assert value("retrysafe_requests_total", **labels) == 1, outcome


@pytest.mark.parametrize("store", METRIC_STORES[:1], indirect=True)
def test_settings_wired_tracing_makes_store_spans(
    settings: Any, store: Any, client_kind: str
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings.RETRYSAFE = {**OpenTelemetryTracing(tracer_provider=provider).wire(store)}
    assert Api(client_kind).post("/orders", key="s1").status_code == 201
    names = sorted(s.name for s in exporter.get_finished_spans())
    assert names == ["retrysafe.complete", "retrysafe.reserve"]
    assert {dict(s.attributes or {})["db.system.name"] for s in exporter.get_finished_spans()} == {
        "sqlite"
    }
