"""One small orders endpoint per front, as a user's app would have it.

Each app counts the orders it really created (``effects``) and can hold its handler until the
test lets it go (``gate``), so a test can have a request in progress while it sends another.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Response


@dataclass
class Orders:
    """What the handlers did, for the test to check."""

    effects: list[dict[str, Any]] = field(default_factory=list)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    #: Set: handlers wait for it (threads); the async twin is made per loop.
    gate: threading.Event = field(default_factory=threading.Event)
    entered: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.gate.set()

    def create(self, payload: dict[str, Any]) -> dict[str, Any]:
        order = {"id": next(self.ids), **payload}
        self.effects.append(order)
        return order

    def hold(self) -> None:
        """Make the next handlers wait until :meth:`release`."""
        self.gate.clear()
        self.entered.clear()

    def release(self) -> None:
        self.gate.set()

    def wait_sync(self) -> None:
        self.entered.set()
        assert self.gate.wait(10), "the test never released the handler"

    async def until_entered(self) -> None:
        """Wait (on the event loop) until a handler is held at the gate."""
        for _ in range(1000):
            if self.entered.is_set():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("no handler reached the gate")

    async def wait_async(self) -> None:
        self.entered.set()
        for _ in range(1000):
            if self.gate.is_set():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the test never released the handler")


def fastapi_app(store: Any, orders: Orders, **options: Any) -> Any:
    from retrysafe.contrib.fastapi import idempotent, install

    app = FastAPI()
    install(app, store=store, **options)

    @app.post("/orders", status_code=201)
    @idempotent(required=True)
    async def create(payload: dict[str, Any], response: Response) -> dict[str, Any]:
        await orders.wait_async()
        order = orders.create(payload)
        response.headers["Location"] = f"/orders/{order['id']}"
        return order

    return app


def starlette_app(store: Any, orders: Orders, **options: Any) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from retrysafe.asgi import IdempotencyMiddleware

    async def create(request: Request) -> JSONResponse:
        await orders.wait_async()
        order = orders.create(await request.json())
        return JSONResponse(order, status_code=201, headers={"Location": f"/orders/{order['id']}"})

    app = Starlette(routes=[Route("/orders", create, methods=["POST"])])
    return IdempotencyMiddleware(app, store=store, required=True, **options)


def flask_app(store: Any, orders: Orders, **options: Any) -> Any:
    from flask import Flask, request

    from retrysafe.contrib.flask import Idempotency, idempotent

    app = Flask(__name__)
    Idempotency(app, store=store, **options)

    @app.post("/orders")
    @idempotent(required=True)
    def create() -> Any:
        orders.wait_sync()
        order = orders.create(request.get_json())
        return order, 201, {"Location": f"/orders/{order['id']}"}

    return app


def wsgi_app(store: Any, orders: Orders, **options: Any) -> Any:
    from retrysafe.wsgi import IdempotencyMiddleware

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        payload = json.loads(environ["wsgi.input"].read(length) or b"{}")
        orders.wait_sync()
        order = orders.create(payload)
        body = json.dumps(order).encode()
        start_response(
            "201 Created",
            [
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(body))),
                ("Location", f"/orders/{order['id']}"),
            ],
        )
        return [body]

    return IdempotencyMiddleware(app, store=store, required=True, **options)


#: The Django views' state (Django finds views by import path, so it lives here).
DJANGO_ORDERS = Orders()
