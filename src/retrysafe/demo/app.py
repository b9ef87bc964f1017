"""OrderHub on Starlette, the default of ``retrysafe demo`` (DESIGN section 5).

Thin: each endpoint reads the request, hands it to :mod:`.domain` and the data layer
(:class:`~retrysafe.demo._async_hub.AsyncOrderHub`), and turns the answer or the domain's
:class:`~retrysafe.demo.domain.Problem` into a Starlette response. :func:`orderhub_setup` (the
store, its metrics, the settings and the data layer) is shared with the FastAPI OrderHub.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Unpack

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from .. import IdempotencyConfig, idempotent
from ..asgi import IdempotencyMiddleware
from ..stores import AsyncStore, resolve_async_store
from . import domain
from ._async_hub import AsyncOrderHub
from .charges import WorkerDesk, WorkerLink

__all__ = [
    "WORKER_ROUTES",
    "OrderHubSetup",
    "add_worker",
    "charge_new_payment",
    "close_worker",
    "create_app",
    "orderhub_setup",
    "problem_response",
    "reset_charges",
]


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


@dataclass
class OrderHubSetup:
    """What an ASGI OrderHub is built from.

    Attributes:
        store: the idempotency store (instrumented when prometheus_client is installed).
        config: the middleware's settings.
        hub: the data layer.
        page: the page at ``/``.
        metrics: whether ``GET /metrics`` is served.
    """

    store: AsyncStore
    config: IdempotencyConfig
    hub: AsyncOrderHub
    page: bytes
    metrics: bool

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """The app's lifespan: on shutdown, close the data layer and the worker desk."""
        yield
        await self.hub.aclose()
        await close_worker(app)


def orderhub_setup(settings: domain.Settings) -> OrderHubSetup:
    """Resolve the store (a bad URL fails here, at start-up) and open the data layer."""
    idempotency_store = resolve_async_store(settings.store)
    db_url = settings.db_url
    transactional = settings.in_transaction(callable(getattr(idempotency_store, "begin", None)))
    hub = AsyncOrderHub(db_url, transactional=transactional)
    on_event = None
    metrics = _metrics()
    if metrics is not None:
        # Count every outcome and time every store call; GET /metrics serves them.
        wired = metrics.wire(idempotency_store)
        idempotency_store, on_event = wired["store"], wired["on_event"]
    config = IdempotencyConfig(
        ttl=settings.ttl, lease=settings.lease, transactional=transactional, on_event=on_event
    )
    return OrderHubSetup(
        idempotency_store, config, hub, domain.page(settings.store, db_url), metrics is not None
    )


def problem_response(problem: domain.Problem, headers: Mapping[str, str] | None = None) -> Response:
    """A domain problem as a Starlette (or FastAPI) response."""
    return Response(
        problem.body(),
        problem.status,
        headers={**(headers or {}), **problem.headers()},
        media_type="application/problem+json",
    )


async def _domain_error(request: Request, exc: Exception) -> Response:
    return problem_response(domain.problem_of(exc))


async def _http_error(request: Request, exc: Exception) -> Response:
    # Starlette's own answers (an unknown path, a method not allowed) as problems too.
    assert isinstance(exc, HTTPException)
    title = exc.detail or "HTTP error"
    return problem_response(domain.Problem(exc.status_code, title, title), exc.headers)


def _hub(request: Request) -> AsyncOrderHub:
    hub: AsyncOrderHub = request.app.state.orderhub
    return hub


async def index(request: Request) -> Response:
    """The page."""
    return HTMLResponse(request.app.state.page)


async def _create(request: Request, kind: domain.Kind) -> Response:
    values = domain.parse_record(kind, await request.body())
    knobs = domain.Knobs.from_query(request.query_params.get)
    who = domain.owner(request.headers.get("authorization"))
    record = await _hub(request).create(kind, values, who, knobs, request.scope)
    return JSONResponse(record, 201, headers={"Location": domain.location(kind, record)})


async def create_order(request: Request) -> Response:
    """``POST /orders``: the key is optional."""
    return await _create(request, domain.ORDERS)


@idempotent(required=True)
async def create_payment(request: Request) -> Response:
    """``POST /payments``: the key is required. With the worker, the payment is sent to it to
    be charged (once: a replayed answer sends nothing)."""
    response = await _create(request, domain.PAYMENTS)
    await charge_new_payment(request, json.loads(bytes(response.body)))
    return response


async def charge_new_payment(request: Request, payment: dict[str, Any]) -> None:
    """Send a new payment to the worker to be charged (nothing without a worker)."""
    desk: WorkerDesk | None = request.app.state.worker
    if desk is not None:
        await asyncio.to_thread(desk.charge_new, payment)


def _desk(request: Request) -> WorkerDesk:
    desk: WorkerDesk | None = request.app.state.worker
    if desk is None:
        raise WorkerDesk.missing()
    return desk


async def charges(request: Request) -> Response:
    """``GET /charges``: each payment's charges and the runs of its charge task, counted in the
    database."""
    return JSONResponse(await asyncio.to_thread(_desk(request).charges))


async def charge_again(request: Request) -> Response:
    """``POST /payments/<id>/charge``: send the payment's charge task again (a producer that
    sends twice; ``?flow=plain``: the task without retrysafe)."""
    desk, flow = _desk(request), request.query_params.get("flow")
    sent = await asyncio.to_thread(desk.charge_again, request.path_params["record_id"], flow)
    return JSONResponse(sent, 202)


async def kill_worker(request: Request) -> Response:
    """``POST /worker/kill?flow=retrysafe|plain``: a new payment, its charge task, and a SIGKILL
    of the worker process running it right after it wrote the charge."""
    desk, flow = _desk(request), request.query_params.get("flow")
    return JSONResponse(await asyncio.to_thread(desk.kill, flow), 202)


async def listing(request: Request, kind: domain.Kind) -> Response:
    """``GET /orders``, ``GET /payments`` (``?limit=N``: the newest N)."""
    limit = domain.parse_limit(request.query_params.get("limit"))
    count, records = await _hub(request).list(kind, limit)
    return JSONResponse({"count": count, kind.name: records})


async def detail(request: Request, kind: domain.Kind) -> Response:
    """``GET /orders/<id>``, ``GET /payments/<id>``."""
    record = await _hub(request).get(kind, request.path_params["record_id"])
    if record is None:
        raise domain.Problem.not_found(kind)
    return JSONResponse(record)


async def reset(request: Request) -> Response:
    """``POST /reset``: delete every order and payment (the page's "Reset demo"), and every
    charge and task run."""
    await _hub(request).reset()
    await reset_charges(request)
    return Response(status_code=204)


async def reset_charges(request: Request) -> None:
    """Delete every charge and task run (nothing without a worker)."""
    desk: WorkerDesk | None = request.app.state.worker
    if desk is not None:
        await asyncio.to_thread(desk.reset)


#: The worker's routes: (path, endpoint, method). Without a worker they answer 404 problems.
WORKER_ROUTES = [
    ("/charges", charges, "GET"),
    ("/payments/{record_id:int}/charge", charge_again, "POST"),
    ("/worker/kill", kill_worker, "POST"),
]


def add_worker(app: Starlette, worker: WorkerLink | None, db_url: str, page: bytes) -> None:
    """Give an ASGI OrderHub (Starlette or FastAPI) its worker: the routes, the
    :class:`~retrysafe.demo.charges.WorkerDesk` (``app.state.worker``) and the page, whose
    worker panel shows only with a worker."""
    for path, endpoint, method in WORKER_ROUTES:
        app.router.add_route(path, endpoint, methods=[method], include_in_schema=False)
    app.state.worker = None if worker is None else WorkerDesk(worker, db_url)
    app.state.page = WorkerDesk.page(page, worker is not None)


async def close_worker(app: Starlette) -> None:
    """Release the worker desk's connections."""
    desk: WorkerDesk | None = app.state.worker
    if desk is not None:
        desk.close()


async def metrics(request: Request) -> Response:
    """``GET /metrics``: the Prometheus metrics."""
    from ..contrib.prometheus import metrics_response

    body, content_type = metrics_response()
    return Response(body, media_type=content_type)


def create_app(**options: Unpack[domain.OrderHubOptions]) -> Starlette:
    """Build OrderHub on Starlette.

    Args:
        **options: the fields of :class:`~retrysafe.demo.domain.Settings` (store, db, ttl,
            lease, transactional, worker).

    Returns:
        The ASGI app.
    """
    settings = domain.Settings(**options)
    worker = settings.worker
    setup = orderhub_setup(settings)
    routes = [
        Route("/", index),
        Route("/orders", create_order, methods=["POST"]),
        Route("/orders", functools.partial(listing, kind=domain.ORDERS), methods=["GET"]),
        Route("/orders/{record_id:int}", functools.partial(detail, kind=domain.ORDERS)),
        Route("/payments", create_payment, methods=["POST"]),
        Route("/payments", functools.partial(listing, kind=domain.PAYMENTS), methods=["GET"]),
        Route("/payments/{record_id:int}", functools.partial(detail, kind=domain.PAYMENTS)),
        Route("/reset", reset, methods=["POST"]),
    ]
    if setup.metrics:
        routes.append(Route("/metrics", metrics, methods=["GET"]))

    app = Starlette(
        routes=routes,
        # mypy cannot match a constructor with **options against Starlette's ParamSpec factory.
        middleware=[
            Middleware(IdempotencyMiddleware, store=setup.store, config=setup.config)  # type: ignore[arg-type]
        ],
        exception_handlers={
            domain.Problem: _domain_error,
            domain.DemoFailure: _domain_error,
            domain.DatabaseUnavailable: _domain_error,
            HTTPException: _http_error,
        },
        lifespan=setup.lifespan,
    )
    app.state.orderhub = setup.hub
    add_worker(app, worker, setup.hub.url, setup.page)
    return app
