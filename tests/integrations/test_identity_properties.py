"""The identity property (tests/identity.py) on apps as users write them, through the
frameworks' own test clients: Starlette's TestClient over a Starlette app whose users come from
an authentication middleware, FastAPI's over ``install()``, and Werkzeug's test client over a
bare WSGI app. Each app answers with what it read (first and last value of every query name,
its path, its user, its body), so a replay that answered another request would show."""

from __future__ import annotations

import hashlib
import itertools
import json
import warnings
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl

import pytest
from fastapi import FastAPI
from hypothesis import given, settings
from starlette.applications import Starlette
from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from werkzeug.test import Client

from retrysafe.asgi import IdempotencyMiddleware
from retrysafe.contrib.fastapi import install
from retrysafe.stores import AsyncMemoryStore, MemoryStore
from retrysafe.wsgi import IdempotencyMiddleware as WSGIIdempotencyMiddleware

from ..identity import Send, Shape, check_pair, pairs

PROPERTY = settings(max_examples=40, deadline=None)

with warnings.catch_warnings():
    # Starlette 1.10 asks for httpx2 and warns that its TestClient over httpx is deprecated.
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient


class TokenUser(AuthenticationBackend):
    """The whole Authorization value is the user (an API key, compared exactly)."""

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, SimpleUser] | None:
        token = conn.headers.get("authorization")
        return None if token is None else (AuthCredentials(["authenticated"]), SimpleUser(token))


def starlette_send() -> Send:
    counter = itertools.count(1)

    async def order(request: Request) -> Response:
        query = request.query_params
        read = {name: [query.get(name), query.getlist(name)[-1]] for name in query}
        user = request.user.display_name if request.user.is_authenticated else None
        body = await request.body()
        return JSONResponse(
            {"n": next(counter), "path": request.url.path, "raw": request.scope["raw_path"].hex(),
             "query": read, "user": user, "body": hashlib.sha256(body).hexdigest()},
            status_code=201,
        )  # fmt: skip

    app = Starlette(routes=[Route("/orders/{rest:path}", order, methods=["POST"])])
    # Authentication outside, so retrysafe scopes keys by the user it set (scope["user"]).
    protected = IdempotencyMiddleware(app, store=AsyncMemoryStore())
    client = TestClient(AuthenticationMiddleware(protected, backend=TokenUser()))
    return _httpx_send(client)


def fastapi_send() -> Send:
    app = FastAPI()
    counter = itertools.count(1)

    @app.post("/orders/{rest:path}", status_code=201)
    async def order(rest: str, request: Request) -> dict[str, Any]:
        return {
            "n": next(counter),
            "rest": rest,
            "query": list(request.query_params.multi_items()),
            "auth": request.headers.get("authorization"),
            "body": (await request.body()).hex(),
        }

    install(app, store=AsyncMemoryStore())
    return _httpx_send(TestClient(app))


def _httpx_send(client: TestClient) -> Send:
    def post(target: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any, bytes]:
        response = client.post(target, content=body, headers=headers)
        return response.status_code, response.headers, response.content

    return _sender(post)


def _sender(post: Callable[[str, bytes, dict[str, str]], tuple[int, Any, bytes]]) -> Send:
    def send(shape: Shape, key: str) -> tuple[int, bool, bytes]:
        headers = {"Idempotency-Key": f'"{key}"', **shape.headers}
        status, answer_headers, body = post(shape.target, shape.body, headers)
        return status, answer_headers.get("idempotency-replayed") == "true", body

    return send


def wsgi_send() -> Send:
    counter = itertools.count(1)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length)
        answer = {
            "n": next(counter),
            "path": environ["PATH_INFO"],
            "query": parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True),
            "auth": environ.get("HTTP_AUTHORIZATION"),
            "body": body.hex(),
        }
        start_response("201 Created", [("Content-Type", "application/json")])
        return [json.dumps(answer).encode()]

    client = Client(WSGIIdempotencyMiddleware(app, store=MemoryStore()))

    def post(target: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any, bytes]:
        response = client.post(target, data=body, headers=headers)
        return response.status_code, response.headers, response.get_data()

    return _sender(post)


#: front -> (its client, whether its app sees path bytes that are not UTF-8, and raw paths).
FRONTS: dict[str, tuple[Callable[[], Send], bool, bool]] = {
    "starlette": (starlette_send, True, True),
    "fastapi": (fastapi_send, True, True),
    # Werkzeug's test client decodes the path as UTF-8 (with U+FFFD) and %2F before the app.
    "wsgi-werkzeug": (wsgi_send, False, False),
}


@pytest.mark.parametrize("front", list(FRONTS))
def test_requests_the_app_tells_apart_never_share_a_record(front: str) -> None:
    make, byte_paths, raw_paths = FRONTS[front]
    send = make()

    @PROPERTY
    @given(case=pairs(byte_paths=byte_paths, raw_paths=raw_paths))
    def check(case: tuple[Shape, Shape, bool, str]) -> None:
        check_pair(send, case)

    check()
