"""The plain ASGI form, ``app = IdempotencyMiddleware(app, store=...)`` wrapped around a Starlette
or FastAPI app: its ``@idempotent`` routes are found through the app it wraps (there is no
``scope["app"]`` yet when it runs), for the route settings and for the metric labels, exactly as
when the middleware sits inside the app's own stack."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from retrysafe import idempotent
from retrysafe.asgi import IdempotencyMiddleware
from retrysafe.contrib.prometheus import PrometheusMetrics
from retrysafe.stores import AsyncMemoryStore

from .helpers import REPLAYED, client_for, key, problem_type


@idempotent(required=True)
async def pay(request: Request) -> Response:
    return JSONResponse({"paid": True}, status_code=201)


@idempotent(enabled=False)
async def webhook(request: Request) -> Response:
    return JSONResponse({"seen": True}, status_code=201)


def starlette_app(**kwargs: Any) -> Starlette:
    routes = [
        Route("/payments/{id}", pay, methods=["POST"]),
        Route("/webhooks", webhook, methods=["POST"]),
    ]
    return Starlette(routes=routes, **kwargs)


def wrapped(events: list[tuple[str, object]], *, cors: bool = False) -> Any:
    inner: Any = starlette_app()
    if cors:  # another middleware between ours and the app
        inner = CORSMiddleware(inner, allow_origins=["*"])
    return IdempotencyMiddleware(
        inner, store=AsyncMemoryStore(), on_event=lambda e, d: events.append((e, d["route"]))
    )


@pytest.mark.parametrize("cors", [False, True], ids=["direct", "through-cors"])
async def test_a_required_route_of_the_wrapped_app_needs_a_key(cors: bool) -> None:
    events: list[tuple[str, object]] = []
    async with client_for(wrapped(events, cors=cors)) as client:
        missing = await client.post("/payments/7", json={})
        assert missing.status_code == 400
        assert problem_type(missing) == "idempotency-key-missing"
        first = await client.post("/payments/7", json={}, headers=key("w1"))
        again = await client.post("/payments/7", json={}, headers=key("w1"))
    assert first.status_code == 201 and again.headers[REPLAYED] == "true"
    assert events == [
        ("missing_key", "/payments/{id}"),
        ("executed", "/payments/{id}"),
        ("settled", "/payments/{id}"),
        ("replayed", "/payments/{id}"),
    ]


async def test_a_route_of_the_wrapped_app_can_opt_out() -> None:
    events: list[tuple[str, object]] = []
    async with client_for(wrapped(events)) as client:
        one = await client.post("/webhooks", json={}, headers=key("w2"))
        two = await client.post("/webhooks", json={}, headers=key("w2"))
    assert one.status_code == two.status_code == 201
    assert REPLAYED not in two.headers and events == []


async def test_prometheus_labels_carry_the_wrapped_apps_route_template() -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry=registry)
    app = IdempotencyMiddleware(starlette_app(), **metrics.wire(AsyncMemoryStore()))
    async with client_for(app) as client:
        await client.post("/payments/1", json={})
        await client.post("/payments/1", json={}, headers=key("w3"))
        await client.post("/payments/2", json={}, headers=key("w3"))
    labels = {"route": "/payments/{id}", "store": "memory"}
    for outcome, count in [("missing_key", 1), ("executed", 2)]:
        value = registry.get_sample_value(
            "retrysafe_requests_total", {"outcome": outcome, **labels}
        )
        assert value == count, outcome
    unmatched = {"outcome": "executed", "route": "unmatched", "store": "memory"}
    assert registry.get_sample_value("retrysafe_requests_total", unmatched) is None


async def test_a_wrapped_fastapi_app_is_found_too() -> None:
    api = FastAPI()

    @api.post("/orders", status_code=201)
    @idempotent(required=True)
    async def order(body: dict[str, int]) -> dict[str, int]:
        return body

    app = IdempotencyMiddleware(api, store=AsyncMemoryStore())
    async with client_for(app) as client:
        assert (await client.post("/orders", json={"n": 1})).status_code == 400
        assert (await client.post("/orders", json={"n": 1}, headers=key("w4"))).status_code == 201


async def test_inside_the_apps_own_stack_it_behaves_the_same() -> None:
    app = starlette_app(
        middleware=[Middleware(IdempotencyMiddleware, store=AsyncMemoryStore())]  # type: ignore[arg-type]
    )
    async with client_for(app) as client:
        assert (await client.post("/payments/3", json={})).status_code == 400
        assert (await client.post("/payments/3", json={}, headers=key("w5"))).status_code == 201


def test_an_app_without_routes_has_no_route_owner() -> None:
    from retrysafe._asgi_routes import routes_owner

    async def bare(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("not called")

    assert routes_owner(bare) is None
    assert routes_owner(CORSMiddleware(bare, allow_origins=["*"])) is None
    app = starlette_app()
    assert routes_owner(app) is app.router  # the same routes, without the property
    assert routes_owner(CORSMiddleware(app, allow_origins=["*"])) is app.router
    assert routes_owner(app.router) is app.router


def mounted_app() -> Starlette:
    """Marked routes under mounts: a list of routes, a sub-app, and a mount inside a mount."""
    from starlette.routing import Mount

    sub = Starlette(routes=[Route("/payments/{id}", pay, methods=["POST"])])
    return Starlette(
        routes=[
            Mount("/v1", routes=[Route("/payments/{id}", pay, methods=["POST"])]),
            Mount("/v2", app=sub),
            Mount(
                "/v3",
                routes=[Mount("/shop", routes=[Route("/webhooks", webhook, methods=["POST"])])],
            ),
        ]
    )


@pytest.mark.parametrize("placement", ["wrapped", "inside"])
async def test_marked_routes_under_a_mount_are_found(placement: str) -> None:
    events: list[tuple[str, object]] = []
    options: dict[str, Any] = {
        "store": AsyncMemoryStore(),
        "on_event": lambda e, d: events.append((e, d["route"])),
    }
    if placement == "wrapped":
        app: Any = IdempotencyMiddleware(mounted_app(), **options)
    else:
        app = mounted_app()
        app.user_middleware.append(Middleware(IdempotencyMiddleware, **options))  # type: ignore[arg-type]
    async with client_for(app) as client:
        for prefix in ("/v1", "/v2"):
            missing = await client.post(f"{prefix}/payments/7", json={})
            assert missing.status_code == 400, prefix
            assert problem_type(missing) == "idempotency-key-missing"
            first = await client.post(f"{prefix}/payments/7", json={}, headers=key(prefix))
            again = await client.post(f"{prefix}/payments/7", json={}, headers=key(prefix))
            assert first.status_code == 201 and again.headers[REPLAYED] == "true", prefix
        # enabled=False two mounts deep: never stored, never replayed
        one = await client.post("/v3/shop/webhooks", json={}, headers=key("m3"))
        two = await client.post("/v3/shop/webhooks", json={}, headers=key("m3"))
        assert one.status_code == two.status_code == 201 and REPLAYED not in two.headers
    routes = {route for _, route in events}
    assert routes == {"/v1/payments/{id}", "/v2/payments/{id}"}, events


async def test_a_route_under_fastapis_mount_is_found() -> None:
    api = FastAPI()
    sub = FastAPI()

    @sub.post("/orders", status_code=201)
    @idempotent(required=True)
    async def order(body: dict[str, int]) -> dict[str, int]:
        return body

    api.mount("/shop", sub)
    app = IdempotencyMiddleware(api, store=AsyncMemoryStore())
    async with client_for(app) as client:
        assert (await client.post("/shop/orders", json={"n": 1})).status_code == 400
        assert (
            await client.post("/shop/orders", json={"n": 1}, headers=key("m4"))
        ).status_code == 201
