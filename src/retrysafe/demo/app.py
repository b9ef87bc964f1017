"""OrderHub: a small orders-and-payments API protected by retrysafe (DESIGN section 5)."""

from __future__ import annotations

import asyncio
import functools
import json
import os
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from .._core.config import IdempotencyConfig
from .._core.routes import idempotent
from .._core.transaction import mark_committed, transaction
from ..asgi import IdempotencyMiddleware
from ..stores import resolve_async_store
from ._contract import DemoFailure, InvalidRecord, knob_ms, parse_record
from .db import DatabaseUnavailable, OrderDB, open_db

__all__ = ["DEFAULT_STORE", "create_app", "default_db_url"]

DEFAULT_STORE = "sqlite:///./retrysafe-demo.db"


def default_db_url(store_url: str) -> str:
    """OrderHub's data goes to the store's own database when the store is SQL."""
    if store_url.startswith(("sqlite:///", "postgresql://", "postgres://")):
        return store_url.split("?", 1)[0]
    return "sqlite:///./orderhub.db"


def same_database(store_url: str, db_url: str) -> bool:
    """Whether the orders live in the store's own database (so transactional mode applies)."""
    store_base, db_base = store_url.split("?", 1)[0], db_url.split("?", 1)[0]
    if store_base.startswith("sqlite:///") and db_base.startswith("sqlite:///"):
        return os.path.abspath(store_base[10:]) == os.path.abspath(db_base[10:])
    for scheme in ("postgresql://", "postgres://"):
        store_base = store_base.replace(scheme, "postgresql://", 1)
        db_base = db_base.replace(scheme, "postgresql://", 1)
    return store_base.startswith("postgresql://") and store_base == db_base


@functools.cache
def _metrics() -> Any:
    """The process's Prometheus metrics, or ``None`` without prometheus_client.

    Once per process: the metrics register on prometheus_client's global registry, and tests
    build several apps in one process.
    """
    try:
        from ..contrib.prometheus import PrometheusMetrics
    except ImportError:
        return None
    return PrometheusMetrics()


def _problem(
    status: int,
    title: str,
    detail: str,
    slug: str = "invalid-request",
    headers: dict[str, str] | None = None,
) -> Response:
    body = {"type": f"urn:orderhub:problem:{slug}", "title": title, "status": status}
    body["detail"] = detail
    return Response(
        json.dumps(body), status, headers=headers, media_type="application/problem+json"
    )


def _owner(request: Request) -> str:
    auth = request.headers.get("authorization", "")
    scheme, _, name = auth.partition(" ")
    return name.strip() if scheme.lower() == "bearer" and name.strip() else "anonymous"


def _int_param(request: Request, name: str) -> int:
    return knob_ms(request.query_params.get(name))


async def _create(
    request: Request, kind: str, fields: dict[str, type], db: OrderDB, transactional: bool
) -> Response:
    try:
        values = parse_record(await request.body(), kind, fields)
    except InvalidRecord as bad:
        return _problem(bad.status, bad.title, bad.detail)
    delay_ms = _int_param(request, "delay_ms")
    if delay_ms:
        await asyncio.sleep(delay_ms / 1000)
    if request.query_params.get("fail") == "1":
        raise DemoFailure(f"the {kind} handler failed on purpose (?fail=1)")
    if transactional:
        # The order commits together with the stored response (exactly once, even on a crash).
        conn = await transaction(request, optional=True)
        record = await db.add(kind, _owner(request), conn=conn, **values)
    else:
        record = await db.add(kind, _owner(request), **values)
        # From here a crash must not lead to a second order: retries get "outcome unknown".
        await mark_committed(request)
    delay_after_ms = _int_param(request, "delay_after_ms")
    if delay_after_ms:
        await asyncio.sleep(delay_after_ms / 1000)
    return JSONResponse(record, 201, headers={"Location": f"/{kind}/{record['id']}"})


def _listing(kind: str, db: OrderDB) -> Any:
    async def endpoint(request: Request) -> Response:
        limit: int | None = None
        if "limit" in request.query_params:
            try:
                limit = max(0, int(request.query_params["limit"]))
            except ValueError:
                return _problem(400, "Bad limit", "limit must be an integer.")
        count, records = await db.list(kind, limit)
        return JSONResponse({"count": count, kind: records})

    return endpoint


def _detail(kind: str, db: OrderDB) -> Any:
    async def endpoint(request: Request) -> Response:
        record = await db.get(kind, request.path_params["record_id"])
        if record is None:
            return _problem(404, "Not found", f"No such {kind[:-1]}.")
        return JSONResponse(record)

    return endpoint


def create_app(
    *,
    store: str = DEFAULT_STORE,
    db: str | None = None,
    ttl: float = 24 * 3600.0,
    lease: float = 30.0,
    transactional: bool | None = None,
    fastapi: bool = False,
) -> Starlette:
    """Build OrderHub.

    Args:
        store: the idempotency store URL.
        db: where orders and payments live (default: the store's database when it is SQLite).
        ttl: retention of completed records, seconds.
        lease: lease of in-progress records, seconds.
        fastapi: build it as a FastAPI app (the same routes and middleware; needs
            ``retrysafe[fastapi]``) rather than a Starlette one.
        transactional: commit orders together with the stored responses; by default on when
            the orders live in the store's own SQL database.

    Returns:
        The ASGI app.
    """
    # Resolve the store now, so a bad URL fails at start-up rather than on the first request.
    idempotency_store = resolve_async_store(store)
    db_url = db or default_db_url(store)
    database = open_db(db_url)
    if transactional is None:
        transactional = same_database(store, db_url) and callable(
            getattr(idempotency_store, "begin", None)
        )
    page = resources.files("retrysafe.demo").joinpath("static", "index.html").read_bytes()

    async def index(request: Request) -> Response:
        return Response(page, media_type="text/html; charset=utf-8")

    async def create_order(request: Request) -> Response:
        fields = {"item": str, "quantity": int}
        return await _create(request, "orders", fields, database, transactional)

    @idempotent(required=True)
    async def create_payment(request: Request) -> Response:
        fields = {"amount": int, "currency": str}
        return await _create(request, "payments", fields, database, transactional)

    async def reset(request: Request) -> Response:
        await database.reset()
        return Response(status_code=204)

    async def failed(request: Request, exc: Exception) -> Response:
        return _problem(500, "Handler failed", str(exc))

    on_event = None
    metrics = _metrics()
    if metrics is not None:
        # Count every outcome and time every store call; GET /metrics serves them.
        wired = metrics.wire(idempotency_store)
        idempotency_store, on_event = wired["store"], wired["on_event"]

    async def metrics_endpoint(request: Request) -> Response:
        from ..contrib.prometheus import metrics_response

        body, content_type = metrics_response()
        return Response(body, media_type=content_type)

    async def unavailable(request: Request, exc: Exception) -> Response:
        # The database stayed busy (SQLite's single writer held by a long transaction) or
        # unreachable for longer than a write waits: nothing was written, retrying is safe.
        return _problem(
            503,
            "Database busy",
            f"The order database could not take the write; retry later. ({exc})",
            slug="database-unavailable",
            headers={"Retry-After": "1"},
        )

    routes: list[BaseRoute] = [
        Route("/", index),
        Route("/orders", create_order, methods=["POST"]),
        Route("/orders", _listing("orders", database), methods=["GET"]),
        Route("/orders/{record_id:int}", _detail("orders", database)),
        Route("/payments", create_payment, methods=["POST"]),
        Route("/payments", _listing("payments", database), methods=["GET"]),
        Route("/payments/{record_id:int}", _detail("payments", database)),
        Route("/reset", reset, methods=["POST"]),
    ]
    if metrics is not None:
        routes.append(Route("/metrics", metrics_endpoint, methods=["GET"]))
    config = IdempotencyConfig(ttl=ttl, lease=lease, transactional=transactional, on_event=on_event)
    # mypy cannot match a constructor with **options against Starlette's ParamSpec factory.
    middleware = [Middleware(IdempotencyMiddleware, store=idempotency_store, config=config)]  # type: ignore[arg-type]
    handlers: dict[Any, Any] = {DemoFailure: failed, DatabaseUnavailable: unavailable}
    if fastapi:
        from fastapi import FastAPI

        # FastAPI serves Starlette routes as they are; its own /docs and /openapi.json come on top.
        return FastAPI(routes=routes, middleware=middleware, exception_handlers=handlers)
    return Starlette(routes=routes, middleware=middleware, exception_handlers=handlers)
