"""docs/grafana-dashboard.json queries only metrics, labels and outcomes the code exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from retrysafe.asgi import IdempotencyMiddleware
from retrysafe.contrib.prometheus import METRIC_NAMES, OUTCOMES, PrometheusMetrics

from ..integrations.helpers import client_for, key

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def _exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


async def _exported() -> dict[str, set[str]]:
    """Sample name -> label names, as a real app's registry exposes them after traffic."""
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry=registry)

    async def create(request: Request) -> Response:
        return Response(status_code=201)

    app = Starlette(
        routes=[Route("/orders", create, methods=["POST"])],
        middleware=[Middleware(IdempotencyMiddleware, **metrics.wire("memory://"))],
    )
    async with client_for(app) as client:
        await client.post("/orders", headers=key("g"))
        await client.post("/orders", headers=key("g"))
    metrics.completions.labels("deferred", "memory").inc()
    metrics.store_errors.labels("reserve", "memory").inc()
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
    return found


async def test_every_queried_metric_and_label_is_exported(dashboard: dict[str, Any]) -> None:
    exported = await _exported()
    used: set[str] = set()
    for expr in _exprs(dashboard):
        for selector in re.finditer(r"\b(retrysafe_[a-z_]+)(\{([^}]*)\})?", expr):
            name = selector.group(1)
            assert name in exported, f"{name} is not exported ({expr})"
            used.add(name)
            for label in re.findall(r"(\w+)\s*=~?", selector.group(3) or ""):
                assert label in exported[name], f"{name} has no label {label}"
        for group in re.findall(r"by \(([^)]*)\)", expr):
            names = re.findall(r"\b(retrysafe_[a-z_]+)", expr)
            labels = set.union(*(exported[n] for n in names))
            for label in (g.strip() for g in group.split(",")):
                assert label in labels, f"grouping by unknown label {label} in {expr}"
        for values in re.findall(r'outcome=~?"([^"]*)"', expr):
            for outcome in values.split("|"):
                assert outcome in OUTCOMES.values(), f"unknown outcome {outcome}"
    # Every exported metric is on the dashboard.
    for name in METRIC_NAMES:
        assert any(u == name or u.startswith(name + "_") for u in used), name


def test_template_variables_query_exported_metrics(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("store", "route"):
        query = variables[name]["query"]["query"]
        assert re.match(rf"label_values\(retrysafe_requests_total.*, {name}\)$", query)
    referenced = {m for e in _exprs(dashboard) for m in re.findall(r"\$(\w+)", e)}
    assert referenced <= set(variables) | {"__rate_interval", "__range"}


def test_panels_are_well_formed(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] and dashboard["title"]
    for panel in dashboard["panels"]:
        assert panel["type"] in {"timeseries", "stat"}
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"])
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        assert panel["targets"]
