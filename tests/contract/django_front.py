"""The ``django`` and ``django-async`` shells of the wire-contract suite: the orders app as
Django views behind :class:`retrysafe.contrib.django.IdempotencyMiddleware`, driven through
Django's own test clients.

- ``django``: sync views, :class:`django.test.Client` (the WSGI path of the middleware, a sync
  store). Requests arrive as the environ a WSGI server builds (:func:`~.harness.wsgi_environ`,
  plus ``wsgi.input_terminated`` as gunicorn sets it); concurrent requests come from threads,
  each with its own ``Client`` over one shared handler (one middleware instance, as in one
  threaded worker).
- ``django-async``: ``async def`` views, :class:`django.test.AsyncClient` (the ASGI path of the
  middleware, an async store), on one event loop in a thread of its own, as under an ASGI
  server (async stores bind their connections to the loop of first use).

The views behave as the harness's apps do (the same :func:`~.harness.plan`, the same knobs).
Django is configured with the settings module of tests/django (``tests.django.settings``, set
the same way its conftest sets it, so both folders run in one process); each front's
``MIDDLEWARE`` and ``RETRYSAFE`` are overridden only while its handler loads its middleware
(which reads them once), and its URLconf is set per request by :func:`contract_urls`.

Where Django's test client differs from a WSGI/ASGI server it differs as Django does: a
response holds one value per header name (repeated fields are joined with ``", "``), and every
request carries the client's (empty) ``Cookie`` header.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django.settings")

import django

django.setup()

import httpx  # noqa: E402
from asgiref.sync import iscoroutinefunction, markcoroutinefunction  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402
from django.http import (  # noqa: E402
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    StreamingHttpResponse,
)
from django.test import AsyncClient, Client, override_settings  # noqa: E402
from django.test.client import FakePayload  # noqa: E402
from django.urls import re_path  # noqa: E402

from retrysafe.contrib.django import amark_committed, mark_committed  # noqa: E402

from .harness import (  # noqa: E402
    WAIT,
    CutStream,
    HandlerFailed,
    Plan,
    World,
    asgi_scope,
    cut_asgi,
    plan,
    wsgi_environ,
)

__all__ = ["DjangoAsyncFront", "DjangoFront", "contract_urls", "urlpatterns"]

#: Where the front puts its World for the views: a WSGI environ key / an ASGI scope key.
WORLD_KEY = "contract.world"


def _world(request: HttpRequest) -> World:
    world = request.META.get(WORLD_KEY) or getattr(request, "scope", {}).get(WORLD_KEY)
    assert isinstance(world, World)
    return world


def _plan(request: HttpRequest) -> tuple[World, Plan]:
    world = _world(request)
    headers = {name.lower(): value for name, value in request.headers.items()}
    query = request.META.get("QUERY_STRING", "")
    return world, plan(world, request.path, query, request.body, headers)


def _headed(response: HttpResponseBase, p: Plan) -> HttpResponseBase:
    """Every header as planned and nothing more (no default Content-Type on a 204); a
    repeated field joined as Django's HttpResponse holds it."""
    del response["Content-Type"]
    for name, value in p.headers:
        response[name] = f"{response[name]}, {value}" if name in response else value
    return response


def orders(request: HttpRequest) -> HttpResponseBase:
    """The orders view (sync)."""
    world, p = _plan(request)
    if p.mark:
        world.marks.append(mark_committed(request))
    if p.hold:
        world.held(p.run)
    if p.sleep:
        time.sleep(p.sleep)
    if p.fail:
        raise HandlerFailed("the handler failed")  # Django answers 500 (DEBUG off)
    if len(p.chunks) == 1:
        return _headed(HttpResponse(p.chunks[0], status=p.status), p)

    def stream() -> Iterator[bytes]:
        for i, chunk in enumerate(p.chunks):
            if i == 1 and p.midway:
                raise HandlerFailed("the body failed midway")
            yield chunk

    return _headed(StreamingHttpResponse(stream(), status=p.status), p)


async def aorders(request: HttpRequest) -> HttpResponseBase:
    """The orders view (async)."""
    world, p = _plan(request)  # the body is in memory already (ASGIRequest)
    if p.mark:
        world.marks.append(await amark_committed(request))
    if p.hold:
        # In a worker thread: the event loop (and the lease renewal on it) keeps running.
        await asyncio.to_thread(world.held, p.run)
    if p.sleep:
        await asyncio.sleep(p.sleep)
    if p.fail:
        raise HandlerFailed("the handler failed")
    if len(p.chunks) == 1:
        return _headed(HttpResponse(p.chunks[0], status=p.status), p)

    async def stream() -> AsyncIterator[bytes]:
        for i, chunk in enumerate(p.chunks):
            await asyncio.sleep(0)
            if i == 1 and p.midway:
                raise HandlerFailed("the body failed midway")
            yield chunk

    return _headed(StreamingHttpResponse(stream(), status=p.status), p)


#: This module is the URLconf of the sync views (one route, any path; an empty route pattern,
#: so the middleware sees no route template, as on the bare WSGI/ASGI shells).
urlpatterns = [re_path("", orders, name="orders")]


class _AsyncUrls:
    """The URLconf of the async views."""

    urlpatterns = [re_path("", aorders, name="aorders")]


ASYNC_URLS = _AsyncUrls()


def contract_urls(get_response: Callable[[HttpRequest], Any]) -> Any:
    """Middleware (first in the front's ``MIDDLEWARE``): route the request to the contract's
    views, whatever ``settings.ROOT_URLCONF`` is (tests/django's)."""
    if iscoroutinefunction(get_response):

        async def amiddleware(request: HttpRequest) -> Any:
            request.urlconf = ASYNC_URLS
            return await get_response(request)

        return markcoroutinefunction(amiddleware)

    def middleware(request: HttpRequest) -> Any:
        request.urlconf = __name__
        return get_response(request)

    return middleware


contract_urls.sync_capable = True  # type: ignore[attr-defined]
contract_urls.async_capable = True  # type: ignore[attr-defined]


def _settings(store: Any, options: dict[str, Any]) -> override_settings:
    return override_settings(
        MIDDLEWARE=[f"{__name__}.contract_urls", "retrysafe.contrib.django.IdempotencyMiddleware"],
        RETRYSAFE={"STORE": store, **{name.upper(): value for name, value in options.items()}},
    )


def _to_httpx(response: HttpResponseBase, body: bytes, request: httpx.Request) -> httpx.Response:
    """The response as a server sends it: its headers, then its cookies (Django's WSGI
    handler does the same)."""
    fields = [*response.items()]
    fields += [("Set-Cookie", cookie.OutputString()) for cookie in response.cookies.values()]
    raw = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in fields]
    return httpx.Response(response.status_code, headers=raw, content=body, request=request)


class DjangoFront:
    """The sync views under the middleware's WSGI path, through ``django.test.Client``.

    Args:
        store: the sync store, as ``RETRYSAFE["STORE"]``.
        world: the effects it shares with other instances.
        **options: fields of :class:`retrysafe.IdempotencyConfig`, as ``RETRYSAFE`` keys.
    """

    def __init__(self, store: Any, world: World, **options: Any) -> None:
        self.world = world
        self.handler = Client().handler
        with _settings(store, options):
            self.handler.load_middleware()
        self.middleware = _innermost(self.handler)
        self._local = threading.local()

    def _client(self) -> Client:
        client: Client | None = getattr(self._local, "client", None)
        if client is None:
            client = Client(raise_request_exception=False)
            client.handler = self.handler  # one middleware instance for every thread
            self._local.client = client
        return client

    def _open(self, request: httpx.Request) -> HttpResponseBase:
        environ = wsgi_environ(request)
        environ["wsgi.input_terminated"] = True  # as gunicorn says: the stream ends at the body
        environ[WORLD_KEY] = self.world
        return self._client().request(**environ)

    def send(self, request: httpx.Request) -> httpx.Response:
        """Send one request and read its whole response (an error in mid-body: a cut
        connection)."""
        response = self._open(request)
        try:
            body = b"".join(response) if response.streaming else response.content
        except Exception as exc:
            raise httpx.RemoteProtocolError("the body ended early", request=request) from exc
        finally:
            response.close()
        return _to_httpx(response, body, request)

    def abandon(self, request: httpx.Request, after: int) -> None:
        """The client goes away after reading ``after`` body chunks (the head is in: the test
        client returns it)."""
        response = self._open(request)
        if response.streaming:
            chunks = iter(response)
            for _ in range(after):
                next(chunks, None)
        response.close()

    def cut(self, request: httpx.Request, sent: int, error: bool) -> int | None:
        """The client leaves after ``sent`` bytes of the body: the environ's stream ends there
        (or fails), its ``Content-Length`` still the whole body's."""
        environ = wsgi_environ(request)
        environ["wsgi.input"] = CutStream(request.content[:sent], error=error)
        environ[WORLD_KEY] = self.world
        response = self._client().request(**environ)
        response.close()
        return response.status_code

    def close(self) -> None:
        """Nothing to release here: the harness closes the (sync) store."""


class DjangoAsyncFront:
    """The async views under the middleware's ASGI path, through ``django.test.AsyncClient``
    on an event loop of the front's own.

    Args:
        store: the async store, as ``RETRYSAFE["STORE"]``; closed by :meth:`close`, on the
            front's loop.
        world: the effects it shares with other instances.
        **options: fields of :class:`retrysafe.IdempotencyConfig`, as ``RETRYSAFE`` keys.
    """

    def __init__(self, store: Any, world: World, **options: Any) -> None:
        self.world = world
        self.store = store
        self.options = options
        self.client = AsyncClient(raise_request_exception=False)
        with _settings(store, options):
            self.client.handler.load_middleware(is_async=True)
        self.middleware = _innermost(self.client.handler)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT)

    def _scope(self, request: httpx.Request) -> dict[str, Any]:
        """The scope an ASGI server builds (as the harness's ASGI shell gets it), with the body
        for the test client."""
        body = request.read()
        return {
            "http_version": "1.1",
            "method": request.method,
            "scheme": "http",
            "path": request.url.path,
            "raw_path": request.url.raw_path.split(b"?")[0],
            "root_path": "",
            "query_string": request.url.query,
            "headers": [(n.lower(), v) for n, v in request.headers.raw],
            "server": ("test", 80),
            "client": ("127.0.0.1", 50000),
            "_body_file": FakePayload(body),
            WORLD_KEY: self.world,
        }

    async def _send(self, request: httpx.Request, scope: dict[str, Any]) -> httpx.Response:
        response = await self.client.request(**scope)
        try:
            if response.streaming:
                body = b"".join([bytes(c) async for c in response.streaming_content])
            else:
                body = response.content
        except Exception as exc:
            raise httpx.RemoteProtocolError("the body ended early", request=request) from exc
        return _to_httpx(response, body, request)

    def send(self, request: httpx.Request) -> httpx.Response:
        """Send one request and read its whole response."""
        return self._run(self._send(request, self._scope(request)))  # type: ignore[no-any-return]

    async def _abandon(self, scope: dict[str, Any], after: int) -> None:
        response = await self.client.request(**scope)
        if response.streaming:
            chunks = response.streaming_content
            for _ in range(after):
                await anext(chunks, None)
            await chunks.aclose()  # Django's closing wrapper: the response is closed

    def abandon(self, request: httpx.Request, after: int) -> None:
        """The client goes away after reading ``after`` body chunks."""
        self._run(self._abandon(self._scope(request), after))

    def cut(self, request: httpx.Request, sent: int, error: bool) -> int | None:
        """The client leaves after ``sent`` bytes of the body, through Django's own ASGI
        handler (the test client hands the view a body it already has): the server reports
        ``http.disconnect``."""
        with _settings(self.store, self.options):
            handler = ASGIHandler()
        scope = {**asgi_scope(request), WORLD_KEY: self.world}
        return self._run(cut_asgi(handler, scope, request.read()[:sent]))  # type: ignore[no-any-return]

    async def _aclose(self) -> None:
        # The lease keeper's sweeper and any background completion end with the loop.
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.store.aclose()

    def close(self) -> None:
        """Close the async store on the front's loop; stop the loop."""
        self._run(self._aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT)
        self.loop.close()


def _innermost(handler: Any) -> Any:
    """The retrysafe middleware instance of a loaded handler (tests may look at it)."""
    from retrysafe.contrib.django.middleware import IdempotencyMiddleware

    for method in handler._view_middleware:
        owner = getattr(method, "__self__", None)
        if isinstance(owner, IdempotencyMiddleware):
            return owner
    raise AssertionError("the handler has no IdempotencyMiddleware")
