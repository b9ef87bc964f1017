"""The ``aiohttp`` shell of the wire-contract suite: the orders app as an aiohttp.web app under
:func:`retrysafe.contrib.aiohttp.setup`, served by aiohttp's own test server on loopback (a
real HTTP server, on an event loop of the front's own) and driven through aiohttp's client.

The handler behaves as the ASGI harness app does (the same :func:`~.harness.plan` and knobs).
Requests come from the harness as ``httpx.Request`` objects (every shell gets the same header
set and body) and go out over a socket as sent; responses come back as ``httpx.Response``
objects with every header field (in order, repeated ones included) and the body.
"""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from retrysafe.contrib.aiohttp import IDEMPOTENCY, mark_committed, setup

from .harness import WAIT, HandlerFailed, World, plan, streamed

__all__ = ["AiohttpFront", "aiohttp_app"]


def aiohttp_app(world: World) -> web.Application:
    """The orders app as an aiohttp.web app (one handler for every path)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {name.lower(): value for name, value in request.headers.items()}
        p = plan(world, request.path, request.rel_url.raw_query_string, body, headers)
        if p.mark:
            world.marks.append(await mark_committed(request))
        if p.hold:
            await asyncio.to_thread(world.held, p.run)
        if p.sleep:
            await asyncio.sleep(p.sleep)
        if p.fail:
            raise HandlerFailed("the handler failed")  # aiohttp answers 500
        if len(p.chunks) > 1:
            response = web.Response(status=p.status, body=streamed(p))
            response.headers.popall("Content-Type", None)
        else:
            response = web.Response(status=p.status, body=p.chunks[0] or None)
        for name, value in p.headers:
            response.headers.add(name, value)
        return response

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", handle)
    return app


class AiohttpFront:
    """One aiohttp app under the middleware, served on loopback by aiohttp's test server.

    Args:
        store: the async store; closed by the app's cleanup (:meth:`close`), on the front's loop.
        world: the effects it shares with other instances.
        **options: fields of :class:`retrysafe.IdempotencyConfig`, as ``setup`` options.
    """

    def __init__(self, store: Any, world: World, **options: Any) -> None:
        self.app = aiohttp_app(world)
        setup(self.app, store=store, **options)
        self.middleware = self.app[IDEMPOTENCY]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = TestServer(self.app, host="127.0.0.1")
        self._run(self.server.start_server())
        self.session: aiohttp.ClientSession = self._run(self._session())

    async def _session(self) -> aiohttp.ClientSession:
        # No cookie jar, no decompression: every response as the server sent it.
        return aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False)

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT)

    def _url(self, request: httpx.Request) -> URL:
        return URL(
            f"http://127.0.0.1:{self.server.port}{request.url.raw_path.decode('ascii')}",
            encoded=True,
        )

    def _headers(self, request: httpx.Request) -> list[tuple[str, str]]:
        skip = (b"host", b"content-length", b"transfer-encoding")
        return [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in request.headers.raw
            if name.lower() not in skip
        ]

    async def _open(self, request: httpx.Request) -> aiohttp.ClientResponse:
        if "chunked" in request.headers.get("transfer-encoding", ""):
            parts = list(request.stream)  # type: ignore[arg-type]

            async def chunks() -> AsyncIterator[bytes]:
                for part in parts:
                    yield part

            data: Any = chunks()
        else:
            # A file-like object: aiohttp's client warns about a large bytes body.
            data = io.BytesIO(request.read())
        return await self.session.request(
            request.method,
            self._url(request),
            headers=self._headers(request),
            data=data,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            allow_redirects=False,
        )

    async def _send(self, request: httpx.Request) -> httpx.Response:
        response = await self._open(request)
        try:
            body = await response.read()
        except aiohttp.ClientError as exc:
            raise httpx.RemoteProtocolError("the body ended early", request=request) from exc
        finally:
            response.release()
        raw = [(n, v) for n, v in response.raw_headers if n.lower() != b"transfer-encoding"]
        return httpx.Response(response.status, headers=raw, content=body, request=request)

    def send(self, request: httpx.Request) -> httpx.Response:
        """Send one request and read its whole response."""
        try:
            return self._run(self._send(request))  # type: ignore[no-any-return]
        except aiohttp.ClientError as exc:
            raise httpx.RemoteProtocolError(str(exc), request=request) from exc

    async def _abandon(self, request: httpx.Request, after: int) -> None:
        response = await self._open(request)
        for _ in range(after):
            await response.content.readany()
        response.close()  # the connection is dropped, not reused

    def abandon(self, request: httpx.Request, after: int) -> None:
        """The client goes away after reading ``after`` parts of the body."""
        self._run(self._abandon(request, after))

    async def _cut(self, request: httpx.Request, sent: int) -> int | None:
        body = request.read()
        reader, writer = await asyncio.open_connection("127.0.0.1", self.server.port)
        head = [f"{request.method} {request.url.raw_path.decode('ascii')} HTTP/1.1"]
        head.append(f"Host: 127.0.0.1:{self.server.port}")
        head += [f"{n}: {v}" for n, v in self._headers(request)]
        head.append(f"Content-Length: {len(body)}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body[:sent])
        await writer.drain()
        writer.write_eof()  # the client closes its side: the body ends early
        try:
            line = await asyncio.wait_for(reader.readline(), WAIT)
        finally:
            writer.close()
        return int(line.split()[1]) if line else None

    def cut(self, request: httpx.Request, sent: int, error: bool) -> int | None:
        """The client leaves after ``sent`` bytes of the body (a real socket, half-closed)."""
        return self._run(self._cut(request, sent))  # type: ignore[no-any-return]

    async def _close(self) -> None:
        await self.session.close()
        await self.server.close()  # the app's cleanup closes the store

    def close(self) -> None:
        """Stop the server (its cleanup closes the store) and the loop."""
        self._run(self._close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT)
        self.loop.close()
