"""What is aiohttp's own in retrysafe.contrib.aiohttp, on a real aiohttp server over loopback
(the wire contract itself runs in tests/contract on every store): a client that leaves while
the handler runs, raised HTTP exceptions, a response the handler streams itself, events
labelled by route, transactional mode, the store closed on cleanup."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from retrysafe.contrib.aiohttp import IDEMPOTENCY, idempotent, setup, transaction

Make = Callable[..., Awaitable[tuple[TestServer, dict[str, Any]]]]
REPLAYED = "Idempotency-Replayed"


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[Make]:
    servers: list[TestServer] = []

    async def build(**options: Any) -> tuple[TestServer, dict[str, Any]]:
        state: dict[str, Any] = {"runs": 0, "finished": 0, "events": []}

        async def slow(request: web.Request) -> web.Response:
            state["runs"] += 1
            await asyncio.sleep(0.5)
            state["finished"] += 1
            return web.json_response({"run": state["runs"]}, status=201)

        async def missing(request: web.Request) -> web.Response:
            state["runs"] += 1
            code = request.query.get("code", "404")
            raise web.HTTPNotFound() if code == "404" else web.HTTPServiceUnavailable()

        async def streamed(request: web.Request) -> web.StreamResponse:
            state["runs"] += 1
            response = web.StreamResponse(status=201, headers={"Location": "/s/1"})
            await response.prepare(request)
            await response.write(b"part one, ")
            await response.write(b"part two")
            await response.write_eof()
            return response

        @idempotent(required=True)
        async def order(request: web.Request) -> web.Response:
            state["runs"] += 1
            if "tx" in request.query:
                conn = await transaction(request)
                conn.execute("INSERT INTO orders (item) VALUES (?)", (await request.text(),))
            return web.json_response({"id": request.match_info["id"]}, status=201)

        app = web.Application()
        app.router.add_post("/slow", slow)
        app.router.add_post("/missing", missing)
        app.router.add_post("/streamed", streamed)
        app.router.add_post("/orders/{id}", order)
        options.setdefault("store", f"sqlite:///{tmp_path}/idempotency.db")
        setup(
            app, on_event=lambda event, details: state["events"].append((event, details)), **options
        )
        state["app"] = app
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        return server, state

    yield build
    for server in servers:
        await server.close()


async def _post(server: TestServer, path: str, key: str, body: bytes = b"{}") -> Any:
    async with aiohttp.ClientSession() as session:
        url = f"http://127.0.0.1:{server.port}{path}"
        async with session.post(url, data=body, headers={"Idempotency-Key": f'"{key}"'}) as r:
            return r.status, r.headers.copy(), await r.read()


async def test_a_client_that_leaves_mid_handler_gets_the_stored_response_on_retry(
    make: Make,
) -> None:
    server, state = await make()
    async with aiohttp.ClientSession() as session:
        url = f"http://127.0.0.1:{server.port}/slow"
        with pytest.raises(asyncio.TimeoutError):
            timeout = aiohttp.ClientTimeout(total=0.1)
            await session.post(url, data=b"{}", headers={"Idempotency-Key": "k"}, timeout=timeout)
    for _ in range(100):  # aiohttp cancels the request; the handler finishes in its own task
        if state["finished"]:
            break
        await asyncio.sleep(0.05)
    status, headers, body = await _post(server, "/slow", "k")
    assert (status, headers[REPLAYED], body) == (201, "true", b'{"run": 1}')
    assert state["runs"] == 1


async def test_a_raised_http_exception_is_stored_or_released_by_its_status(make: Make) -> None:
    server, state = await make()
    first = await _post(server, "/missing?code=404", "a")
    again = await _post(server, "/missing?code=404", "a")
    assert first[0] == again[0] == 404 and again[1][REPLAYED] == "true"
    assert state["runs"] == 1
    await _post(server, "/missing?code=503", "b")
    retried = await _post(server, "/missing?code=503", "b")
    assert retried[0] == 503 and REPLAYED not in retried[1]
    assert state["runs"] == 3


async def test_a_response_the_handler_streams_itself_replays_without_its_body(
    make: Make,
) -> None:
    server, state = await make()
    first = await _post(server, "/streamed", "s")
    again = await _post(server, "/streamed", "s")
    assert first[2] == b"part one, part two"
    assert again[0] == 201 and again[1]["Location"] == "/s/1"
    assert again[1][REPLAYED] == "true" and again[1]["Idempotency-Body-Omitted"] == "true"
    assert again[2] == b"" and state["runs"] == 1


async def test_events_carry_the_route_template(make: Make) -> None:
    server, state = await make()
    await _post(server, "/orders/42", "r")
    await _post(server, "/orders/42", "r")
    routes = {(e, d["route"]) for e, d in state["events"] if e in ("executed", "replayed")}
    assert routes == {("executed", "/orders/{id}"), ("replayed", "/orders/{id}")}


async def test_transactional_writes_commit_with_the_stored_response(
    make: Make, tmp_path: Path
) -> None:
    database = tmp_path / "shop.db"
    with sqlite3.connect(database) as conn:
        conn.execute("CREATE TABLE orders (item TEXT)")
    server, _ = await make(store=f"sqlite:///{database}", transactional=True)
    first = await _post(server, "/orders/1?tx=1", "t", b"tea")
    again = await _post(server, "/orders/1?tx=1", "t", b"tea")
    assert first[0] == 201 and again[1][REPLAYED] == "true"
    with sqlite3.connect(database) as conn:
        assert [row[0] for row in conn.execute("SELECT item FROM orders")] == ["tea"]


async def test_the_store_is_closed_when_the_app_cleans_up(make: Make) -> None:
    server, state = await make(store="memory://")
    middleware = state["app"][IDEMPOTENCY]
    closed: list[bool] = []
    original = middleware.store.aclose

    async def aclose() -> None:
        closed.append(True)
        await original()

    middleware.store.aclose = aclose
    await server.close()
    assert closed == [True]


async def test_the_store_is_opened_at_start_up_and_an_unreachable_one_only_logged(
    make: Make, caplog: pytest.LogCaptureFixture
) -> None:
    # The logger's own level: an earlier test in this process (an embedded worker) may have
    # raised the root logger's.
    caplog.set_level(logging.WARNING, logger="retrysafe")
    server, state = await make(store="redis://127.0.0.1:9/0?timeout=0.5&connect_timeout=0.5")
    assert "cannot be reached at start-up" in caplog.text  # the app started anyway
    status, headers, _ = await _post(server, "/orders/1", "u")
    assert status == 503 and headers["Retry-After"] == "1"
    assert state["runs"] == 0
