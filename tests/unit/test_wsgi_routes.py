"""Per-route settings on the WSGI shell: ``route_options`` maps a request to its route's options."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import httpx

from retrysafe import RouteOptions
from retrysafe.stores import MemoryStore
from retrysafe.wsgi import IdempotencyMiddleware

REQUIRED = RouteOptions(required=True)
OFF = RouteOptions(enabled=False)


def _app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    start_response("201 Created", [("Content-Type", "text/plain")])
    return [environ["PATH_INFO"].encode()]


def _routes(environ: dict[str, Any]) -> RouteOptions | None:
    return {"/payments": REQUIRED, "/off": OFF}.get(environ["PATH_INFO"])


def _client() -> httpx.Client:
    app = IdempotencyMiddleware(_app, store=MemoryStore(), route_options=_routes)
    return httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://t")


def test_a_route_marked_required_answers_400_without_a_key_and_others_run() -> None:
    with _client() as client:
        assert client.post("/payments").status_code == 400
        assert client.post("/orders").status_code == 201


def test_a_route_that_opted_out_is_never_replayed() -> None:
    key = {"Idempotency-Key": "k1"}
    with _client() as client:
        client.post("/off", headers=key)
        assert "idempotency-replayed" not in client.post("/off", headers=key).headers
        client.post("/orders", headers=key)
        assert client.post("/orders", headers=key).headers["idempotency-replayed"] == "true"
