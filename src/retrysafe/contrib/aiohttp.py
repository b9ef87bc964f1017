"""aiohttp.web integration: the same wire contract as every HTTP front, for aiohttp apps.

::

    from aiohttp import web
    from retrysafe.contrib.aiohttp import idempotent, setup

    app = web.Application()
    setup(app, store="sqlite:///idempotency.db")

    @idempotent(required=True)
    async def pay(request: web.Request) -> web.Response: ...

    app.router.add_post("/payments", pay)

:func:`setup` adds the middleware (:func:`idempotency_middleware`, an aiohttp
``@web.middleware``), keeps it under ``app[IDEMPOTENCY]``, opens its store on
``app.on_startup`` and closes it on ``app.on_cleanup``. A thin shell: it translates the
aiohttp request to the neutral request, reads the body within the limit and hands the
response to :mod:`retrysafe._core.http`, which decides everything else.

What the handler returns is settled before aiohttp sends it: a ``web.Response`` (or a raised
``web.HTTPException``) as it is; a body streamed from an async iterable is read first (up to
``max_stored_body_size``, then streamed on, not stored). A ``web.StreamResponse`` the handler
prepares and writes itself has left before the middleware sees it: its status and headers are
stored, its body is not (replays carry ``Idempotency-Body-Omitted: true``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from .._async.runner import AsyncExchange, AsyncRunner
from .._core.config import IdempotencyConfig, front_config, front_store
from .._core.errors import StoreError
from .._core.http import (
    EXECUTE,
    RUN_UNPROTECTED,
    Answer,
    Capture,
    Flow,
    admit,
    client_gone,
    notify,
    too_large,
)
from .._core.options import ConfigSource
from .._core.request import Request, content_length, exact_path
from .._core.routes import idempotent, route_config, route_options
from .._core.transaction import CONTEXT_SCOPE_KEY
from .._core.transaction import mark_committed as core_mark_committed
from .._core.transaction import transaction as core_transaction
from ..stores import AsyncStore, Store, resolve_async_store
from ._extra import extra

with extra("aiohttp"):
    from aiohttp import ClientPayloadError, payload, web
    from aiohttp.http_exceptions import HttpProcessingError

__all__ = [
    "IDEMPOTENCY",
    "IdempotencyMiddleware",
    "idempotency_middleware",
    "idempotent",
    "mark_committed",
    "setup",
    "transaction",
]

#: Handlers that outlive their cancelled request; kept here so they are not garbage-collected.
_detached: set[asyncio.Future[web.StreamResponse]] = set()


def _forget(task: asyncio.Future[web.StreamResponse]) -> None:
    _detached.discard(task)
    if not task.cancelled() and (error := task.exception()) is not None:
        # The key was released; the client that could see the error is gone.
        logging.getLogger("retrysafe").error("detached handler failed", exc_info=error)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: Where the executing request's context lives in the request (a typed key where aiohttp has
#: them: it warns about plain string keys).
_CONTEXT: Any = (
    web.RequestKey(CONTEXT_SCOPE_KEY, AsyncExchange)
    if hasattr(web, "RequestKey")
    else CONTEXT_SCOPE_KEY
)

#: A record id no key hashes to, read at start-up to open the store's connections.
_NO_RECORD = "0" * 64

_MIDDLEWARE = ConfigSource.keywords("idempotency_middleware")
_SETUP = ConfigSource.keywords("setup")


class IdempotencyMiddleware:
    """The aiohttp middleware: makes POST/PATCH requests that carry an ``Idempotency-Key`` safe
    to retry (build it with :func:`idempotency_middleware` or :func:`setup`).

    Args:
        store: a store URL, an async store, or a local synchronous store (memory, SQLite).
        config: the settings; or pass them as keyword arguments instead.
        **options: fields of :class:`~retrysafe.IdempotencyConfig`.

    Raises:
        ConfigurationError: bad settings or store, naming the option (at construction).
    """

    __middleware_version__ = 1  # what @web.middleware marks: a new-style middleware

    def __init__(
        self,
        *,
        store: str | AsyncStore | Store,
        config: IdempotencyConfig | None = None,
        _source: ConfigSource = _MIDDLEWARE,
        **options: Any,
    ) -> None:
        self.store = front_store(resolve_async_store, store, _source)
        self.config = front_config(config, options, self.store, _source)
        self._runner = AsyncRunner(self.store)
        self._routes: dict[int, IdempotencyConfig] = {}

    async def open(self) -> None:
        """Open the store's connections (``setup`` registers this on ``app.on_startup``), so
        the first request does not pay for them. A store that cannot be reached is logged, not
        raised: requests answer ``503`` (or run unprotected, fail-open) until it is back."""
        try:
            await self.store.get(_NO_RECORD)
        except StoreError as exc:
            logging.getLogger("retrysafe").warning(
                "the idempotency store cannot be reached at start-up: %s", exc
            )

    async def close(self) -> None:
        """Close the store (``setup`` registers this on ``app.on_cleanup``)."""
        await self.store.aclose()

    async def __call__(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        config: IdempotencyConfig | None = self.config
        if request.method not in self.config.methods:
            return await handler(request)
        match = request.match_info
        config = route_config(self._routes, route_options(match.handler), self.config)
        keys: list[str] = request.headers.getall("Idempotency-Key", [])
        if config is None or (not keys and not config.required):
            return await handler(request)  # opted out, or no key where it is optional
        neutral = _neutral(request, keys)
        admitted = admit(neutral, config)
        assert admitted is not None  # no key where it is optional passed through above
        body = b""
        if not isinstance(admitted, Answer):
            try:
                body, refused = await _read_body(request, config)
            except asyncio.CancelledError:
                # aiohttp cancels the request when its connection is lost mid-body: nothing ran
                # and no key was reserved.
                notify(config, "client_gone", neutral, "")
                raise
            if refused is not None:
                admitted = refused
        if isinstance(admitted, Answer):
            notify(config, admitted.event or "", neutral, "")
            return _response(admitted)
        # The body is read: handlers get it from request.read()/json()/text()/post().
        request._read_bytes = body
        execution = AsyncExchange(self._runner, Flow(config, neutral, admitted, body))
        verdict = await execution.claim()
        if verdict is RUN_UNPROTECTED:
            return await handler(request)
        if verdict is not EXECUTE:
            assert isinstance(verdict, Answer)
            return _response(verdict)
        # The handler runs in its own task: when aiohttp cancels this request (its client went
        # away), the handler still finishes and its response is stored (guarantee 4).
        task = asyncio.ensure_future(_execute(execution, request, handler))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                _detached.add(task)
                task.add_done_callback(_forget)
            raise


def idempotency_middleware(
    *,
    store: str | AsyncStore | Store,
    config: IdempotencyConfig | None = None,
    **options: Any,
) -> IdempotencyMiddleware:
    """The middleware for ``web.Application(middlewares=[...])`` (close its store yourself with
    ``app.on_cleanup.append(lambda app: middleware.close())``, or use :func:`setup`).

    Args:
        store: a store URL or instance.
        config: settings, or pass :class:`~retrysafe.IdempotencyConfig` fields as keywords.
        **options: fields of :class:`~retrysafe.IdempotencyConfig`.

    Raises:
        ConfigurationError: a bad store or setting, naming it (here, at start-up).
    """
    return IdempotencyMiddleware(store=store, config=config, **options)


#: Where :func:`setup` keeps the app's middleware.
IDEMPOTENCY = web.AppKey("retrysafe.idempotency", IdempotencyMiddleware)


def setup(
    app: web.Application,
    *,
    store: str | AsyncStore | Store,
    config: IdempotencyConfig | None = None,
    **options: Any,
) -> IdempotencyMiddleware:
    """Protect an aiohttp app: add the middleware, keep it under ``app[IDEMPOTENCY]``, open its
    store when the app starts and close it when the app cleans up.

    Args:
        app: the application (before it starts).
        store: a store URL or instance.
        config: settings, or pass :class:`~retrysafe.IdempotencyConfig` fields as keywords.
        **options: fields of :class:`~retrysafe.IdempotencyConfig`.

    Returns:
        The middleware.

    Raises:
        ConfigurationError: a bad store or setting, naming it (``setup(ttl=...): ...``).
    """
    middleware = IdempotencyMiddleware(store=store, config=config, _source=_SETUP, **options)
    app.middlewares.append(middleware)
    app[IDEMPOTENCY] = middleware

    async def open_store(app: web.Application) -> None:
        await middleware.open()

    async def close_store(app: web.Application) -> None:
        await middleware.close()

    app.on_startup.append(open_store)
    app.on_cleanup.append(close_store)
    return middleware


def _context(request: web.Request) -> dict[str, Any]:
    return {CONTEXT_SCOPE_KEY: request.get(_CONTEXT)}


async def transaction(request: web.Request, *, optional: bool = False) -> Any:
    """The database connection of the request's idempotent transaction (transactional mode);
    see :func:`retrysafe.transaction`.

    Raises:
        ConfigurationError: the request has no such transaction (and ``optional`` is false).
    """
    return await core_transaction(_context(request), optional=optional)


async def mark_committed(request: web.Request) -> bool:
    """Declare the request's side effects committed; see :func:`retrysafe.mark_committed`."""
    return await core_mark_committed(_context(request))


def _route(request: web.Request) -> str | None:
    resource = request.match_info.route.resource
    return None if resource is None else resource.canonical


def _neutral(request: web.Request, keys: list[str]) -> Request:
    raw = request.raw_path.partition("?")[0]
    return Request(
        request.method,
        request.path,
        request.rel_url.raw_query_string.encode("latin-1", "replace"),
        [key.encode("latin-1", "replace") for key in keys],
        content_length(request.headers.get("Content-Length", "")),
        request.headers.get("Content-Type", "").encode("latin-1", "replace"),
        request.headers.get("Authorization", "").encode("latin-1", "replace"),
        request.get("user"),  # an auth middleware that runs before ours may set it
        None,
        route=_route(request),
        source=request,
        find_headers=_headers,
        exact_path=exact_path(request.path, raw.encode("latin-1", "replace")),
    )


def _headers(request: web.Request) -> list[tuple[bytes, bytes]]:
    return [(name.lower(), value) for name, value in request.raw_headers]


async def _read_body(
    request: web.Request, config: IdempotencyConfig
) -> tuple[bytes, Answer | None]:
    """The whole body within ``max_body_size``, or the answer that refuses it."""
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.content.iter_any():
            size += len(chunk)
            if size > config.max_body_size:
                return b"", too_large(config)
            chunks.append(chunk)
    except (OSError, ClientPayloadError, HttpProcessingError):  # the client left mid-body
        return b"", client_gone()
    declared = content_length(request.headers.get("Content-Length", ""))
    if declared >= 0 and size < declared:
        return b"", client_gone()
    return b"".join(chunks), None


def _response(answer: Answer) -> web.Response:
    response = web.Response(status=answer.status, body=answer.body)
    headers = response.headers
    for name, value in answer.headers:
        headers.add(name.decode("latin-1"), value.decode("latin-1"))
    return response


def _pairs(response: web.StreamResponse) -> list[tuple[bytes, bytes]]:
    return [
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in response.headers.items()
    ]


async def _execute(
    execution: AsyncExchange, request: web.Request, handler: Handler
) -> web.StreamResponse:
    """Run the handler once for the won key and settle its response before it is sent."""
    request[_CONTEXT] = execution
    execution.start()
    config = execution.flow.config
    try:
        try:
            response = await handler(request)
        except web.HTTPException as raised:  # aiohttp's way to answer 3xx/4xx: a response
            body = raised.body
            data = bytes(body) if isinstance(body, bytes | bytearray) else b""
            omitted = body is not None and not isinstance(body, bytes | bytearray)
            answer = await execution.settle(raised.status, _pairs(raised), data, omitted)
            if answer is not None:
                return _response(answer)
            raise
        except BaseException as exc:
            answer = await execution.fail(exc, False)
            if answer is None:
                raise
            return _response(answer)
        headers = _pairs(response)
        for name, value in execution.flow.added_headers:  # e.g. the retention header
            response.headers[name.decode("latin-1")] = value.decode("latin-1")
        capture = Capture(config.max_stored_body_size)
        rest: AsyncIterator[bytes] | None = None
        if response.prepared:
            # Streamed by the handler itself: its body has left unseen; store status and headers.
            capture.omitted = True
        elif isinstance(response, web.Response):
            body = response.body
            if isinstance(body, bytes | bytearray):
                capture.add(bytes(body))
            elif isinstance(body, payload.AsyncIterablePayload):
                try:
                    rest = await _read_stream(body._value, capture)
                except BaseException as exc:
                    await execution.fail(exc, True)
                    raise
                if rest is None:
                    response.body = capture.body
            elif isinstance(body, payload.BytesPayload):
                capture.add(bytes(body._value))
            elif body is not None:
                capture.omitted = True  # a file or other payload: sent, not stored
        else:
            capture.omitted = True
        answer = await execution.settle(response.status, headers, capture.body, capture.omitted)
        if answer is not None:
            return _response(answer)
        if rest is not None:
            assert isinstance(response, web.Response)
            response.body = payload.AsyncIterablePayload(rest)
        return response
    finally:
        await execution.end()
        del request[_CONTEXT]


async def _read_stream(source: Any, capture: Capture) -> AsyncIterator[bytes] | None:
    """Read a streamed body into ``capture``; past its limit, the rest as an iterator (what was
    read, then the remainder), ``None`` when it was read whole."""
    iterator = source.__aiter__()
    seen: list[bytes] = []
    async for chunk in iterator:
        seen.append(chunk)
        capture.add(chunk)
        if capture.omitted:
            return _chain(seen, iterator)
    return None


async def _chain(first: list[bytes], iterator: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    for chunk in first:
        yield chunk
    async for chunk in iterator:
        yield chunk
