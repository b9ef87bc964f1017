"""The Django middleware: a thin shell over the request flow, sync and async.

Django calls it in the mode of its stack: under WSGI it drives the sync runner
(:class:`~retrysafe._sync.runner.Exchange`), under ASGI the async one
(:class:`~retrysafe._async.runner.AsyncExchange`), with no thread hop per request. The work is
split the way Django splits a request:

- ``process_view`` (the view, hence its ``@idempotent`` marks, is known): admission, the body,
  the claim; a replay or a problem answer is returned from here and the view never runs. In
  transactional mode the view's ``transaction.atomic()`` block is entered here.
- ``__call__``, once the inner middleware and the view have answered: the response is captured
  and settled (stored, or the key released), and the atomic block commits with the record.

Every decision is the flow's (:mod:`retrysafe._core.http`); this module only translates.
"""

from __future__ import annotations

import hashlib
import io
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from asgiref.sync import async_to_sync, iscoroutinefunction, markcoroutinefunction
from django.core.exceptions import ImproperlyConfigured, RequestDataTooBig
from django.http import HttpRequest, HttpResponse, HttpResponseBase, UnreadablePostError
from django.http.request import RawPostDataException

from ..._async.runner import AsyncExchange, AsyncRunner
from ..._core.config import IdempotencyConfig, RouteOptions, front_config
from ..._core.errors import ConfigurationError, StoreError
from ..._core.http import EXECUTE, RUN_UNPROTECTED, Answer, Capture, Flow, admit, notify, too_large
from ..._core.request import Request
from ..._core.routes import route_config, route_options
from ..._core.transaction import CONTEXT_SCOPE_KEY, context_transaction
from ..._sync.runner import Exchange, Runner
from ...stores import AsyncStore, Store, resolve_async_store, resolve_store
from ...wsgi import _ClientGone as WSGIClientGone
from ...wsgi import _read_body as read_wsgi_body
from ...wsgi import _RequestTooLarge as WSGIRequestTooLarge
from ...wsgi import request_from_environ
from .conf import is_django_store, load_settings
from .store import (
    AsyncDjangoStore,
    AsyncDjangoTransaction,
    DjangoStore,
    DjangoTransaction,
    current_route,
)

__all__ = [
    "IdempotencyMiddleware",
    "amark_committed",
    "async_store",
    "atransaction",
    "mark_committed",
    "sync_store",
    "transaction",
    "view_options",
]

logger = logging.getLogger("retrysafe")

#: Where ``process_view`` leaves the request's exchange for ``__call__`` (and for the view's
#: :func:`mark_committed`).
EXCHANGE_ATTR = "_retrysafe_exchange"


def sync_store(store: Any) -> Store:
    """The synchronous store ``settings.RETRYSAFE["STORE"]`` names.

    Raises:
        ConfigurationError: an unknown scheme, a missing extra or database alias.
    """
    if is_django_store(store):
        return DjangoStore.from_url(store)
    return resolve_store(store)


def async_store(store: Any) -> AsyncStore:
    """The async store ``settings.RETRYSAFE["STORE"]`` names (ASGI deployments)."""
    if is_django_store(store):
        return AsyncDjangoStore.from_url(store)
    if isinstance(store, DjangoStore):
        return AsyncDjangoStore(store)
    return resolve_async_store(store)


def view_options(view_func: Any, method: str) -> RouteOptions | None:
    """The ``@idempotent`` marks of the view a request goes to: on the handler method of a
    class-based view or DRF action (``post``, ``create``), else on the class, else on the view
    function."""
    cls = getattr(view_func, "cls", None) or getattr(view_func, "view_class", None)
    if cls is not None:
        actions = getattr(view_func, "actions", None)  # DRF ViewSet.as_view({"post": "create"})
        name = actions.get(method.lower()) if isinstance(actions, dict) else method.lower()
        handler = getattr(cls, name, None) if name else None
        found = route_options(handler) if handler is not None else None
        if found is None:
            found = route_options(cls)
        if found is not None:
            return found
    return route_options(view_func)


def mark_committed(request: HttpRequest) -> bool:
    """Declare the view's side effects committed (non-transactional mode); see
    :func:`retrysafe.mark_committed`. Sync views only; async views use
    :func:`amark_committed`.

    Returns:
        ``True`` when recorded (or the request has no key); ``False`` when the store could not
        be reached or the lease was lost.
    """
    exchange = getattr(request, EXCHANGE_ATTR, None)
    if exchange is None:
        return True
    if isinstance(exchange, AsyncExchange):  # a sync view on an ASGI stack
        return bool(async_to_sync(exchange.mark_committed)())
    return bool(exchange.mark_committed())


async def amark_committed(request: HttpRequest) -> bool:
    """The async twin of :func:`mark_committed`."""
    exchange = getattr(request, EXCHANGE_ATTR, None)
    return True if exchange is None else bool(await exchange.mark_committed())


def transaction(request: HttpRequest, *, optional: bool = False) -> Any:
    """The connection of the request's transaction with a SQL URL store in transactional mode
    (``sqlite3.Connection``, ``psycopg.Connection``): the view's writes on it commit with the
    stored response. (With the ``django`` store the view simply uses the ORM.) Sync stack; see
    :func:`atransaction` for ASGI.

    Raises:
        ConfigurationError: the request has no such transaction and ``optional`` is false.
    """
    exchange = getattr(request, EXCHANGE_ATTR, None)
    tx = context_transaction({CONTEXT_SCOPE_KEY: exchange}, optional=optional)
    if tx is None:
        return None
    if isinstance(exchange, AsyncExchange):  # a sync view on an ASGI stack
        return async_to_sync(tx.connection)()
    return tx.connection()


async def atransaction(request: HttpRequest, *, optional: bool = False) -> Any:
    """The async twin of :func:`transaction` (``asyncpg`` or ``sqlite3`` connection)."""
    tx = context_transaction({CONTEXT_SCOPE_KEY: getattr(request, EXCHANGE_ATTR, None)},
                             optional=optional)  # fmt: skip
    return None if tx is None else await tx.connection()


def _neutral(request: HttpRequest) -> Request:
    neutral = request_from_environ(request.META)
    neutral.path = request.path  # with SCRIPT_NAME: the path the client used
    match = request.resolver_match
    route = getattr(match, "route", None)
    if route:
        neutral.route = "/" + route.lstrip("/")
    return neutral


def _to_response(answer: Answer) -> HttpResponse:
    response = HttpResponse(answer.body, status=answer.status)
    del response["Content-Type"]  # only the answer's own headers
    for raw_name, raw_value in answer.headers:
        name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
        response[name] = f"{response[name]}, {value}" if name in response else value
    return response


def _added(response: Any, exchange: Any) -> Any:
    """The view's response with the headers the flow adds to it (e.g. the retention header)."""
    for name, value in exchange.flow.added_headers:
        response[name.decode("latin-1")] = value.decode("latin-1")
    return response


def _head(response: HttpResponseBase) -> tuple[int, list[tuple[bytes, bytes]]]:
    headers = [
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in response.items()
    ]
    return response.status_code, headers


def _parsed_form(request: HttpRequest) -> bytes:
    """A canonical encoding of a parsed form (fields, then files by name, size and SHA-256):
    equal for equal submissions, different when a field or a file differs."""
    parts: list[bytes] = []
    for name in sorted(request.POST):
        for value in request.POST.getlist(name):
            parts.append(f"field\0{name}\0{value}".encode())
    for name in sorted(request.FILES):
        for upload in request.FILES.getlist(name):
            digest = hashlib.sha256()
            for chunk in upload.chunks():
                digest.update(chunk)
            upload.seek(0)  # the view reads it again
            parts.append(f"file\0{name}\0{upload.name}\0{upload.size}\0".encode())
            parts.append(digest.hexdigest().encode())
    return b"\n".join(parts)


def _read_body(request: HttpRequest, config: IdempotencyConfig) -> bytes | Answer | None:
    """The body within the limit; an answer (413) past it; ``None``: the client left."""
    meta = request.META
    if (
        meta.get("wsgi.input_terminated")
        and "chunked" in meta.get("HTTP_TRANSFER_ENCODING", "").lower()
        and not hasattr(request, "_body")
    ):
        # Django reads a WSGI body by its Content-Length only, so it would see a chunked one
        # (de-chunked by the server) as empty, and two different bodies would share one
        # fingerprint. Read it here, as the WSGI shell does, and hand it to Django the way its
        # own HttpRequest.body keeps a body it has read.
        try:
            chunked = read_wsgi_body(meta, -1, config.max_body_size)
        except WSGIRequestTooLarge:
            return too_large(config)
        except WSGIClientGone:
            return None
        request._body = chunked
        request._stream = io.BytesIO(chunked)
    try:
        body: bytes = request.body
    except RequestDataTooBig:
        return too_large(config)
    except (UnreadablePostError, OSError):
        return None
    except RawPostDataException:
        # A middleware before this one parsed a multipart body from the stream (e.g. CSRF
        # reading request.POST): the raw bytes are gone, so fingerprint what was parsed.
        body = _parsed_form(request)
    if len(body) > config.max_body_size:
        return too_large(config)
    return body


async def _replay_chunks(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


class IdempotencyMiddleware:
    """Makes POST/PATCH requests that carry an ``Idempotency-Key`` safe to retry (Django).

    Add ``"retrysafe.contrib.django.IdempotencyMiddleware"`` to ``MIDDLEWARE`` after the
    authentication middleware (the principal is ``request.user``) and after
    ``CsrfViewMiddleware``; settings come from ``settings.RETRYSAFE``.

    Args:
        get_response: the next handler (Django passes it).

    Raises:
        ImproperlyConfigured: bad settings (at start-up, never per request).
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        try:
            settings = load_settings()
            if self.is_async:
                self.store: Any = async_store(settings.store)
                self._arunner = AsyncRunner(self.store)
            else:
                self.store = sync_store(settings.store)
                self._runner = Runner(self.store)
            self.config = front_config(settings.config, {}, self.store)
        except ConfigurationError as exc:
            raise ImproperlyConfigured(str(exc)) from exc
        self._configs: dict[int, IdempotencyConfig] = {}
        if self.is_async:
            markcoroutinefunction(self)
            # Django adapts process_view to the stack's mode by its type: give it a coroutine.
            self.process_view = self._aprocess_view  # type: ignore[method-assign]

    # -- before the view ---------------------------------------------------------------------

    def _admit(
        self, request: HttpRequest, view_func: Any
    ) -> tuple[IdempotencyConfig, Request, str, bytes] | HttpResponse | None:
        """Admission and the body; ``None``: run the view unprotected."""
        base = self.config
        if request.method not in base.methods:
            return None
        config = route_config(self._configs, view_options(view_func, request.method or ""), base)
        if config is None:  # the view opted out
            return None
        neutral = _neutral(request)
        admitted = admit(neutral, config)
        if admitted is None:
            return None
        if not isinstance(admitted, Answer):
            body = _read_body(request, config)
            if body is None:  # the body ended early: the client left, nothing runs
                return HttpResponse(status=400)
            if isinstance(body, bytes):
                return config, neutral, admitted, body
            admitted = body
        notify(config, admitted.event or "", neutral, "")
        return _to_response(admitted)

    def process_view(
        self, request: HttpRequest, view_func: Any, view_args: Any, view_kwargs: Any
    ) -> HttpResponse | None:
        """Claim the key before the view runs (sync stack)."""
        admitted = self._admit(request, view_func)
        if admitted is None or isinstance(admitted, HttpResponse):
            return admitted
        config, neutral, key, body = admitted
        neutral.user = getattr(request, "user", None)
        exchange = Exchange(self._runner, Flow(config, neutral, key, body))
        label = current_route.set(f"{neutral.method} {neutral.route or neutral.path}")
        try:
            verdict = exchange.claim()
        finally:
            current_route.reset(label)
        if verdict is RUN_UNPROTECTED:
            return None
        if verdict is not EXECUTE:
            assert isinstance(verdict, Answer)
            return _to_response(verdict)
        if isinstance(exchange.transaction, DjangoTransaction):
            try:
                exchange.transaction.connection()  # enter the view's atomic block now
            except StoreError as exc:
                answer = exchange.fail(exc, False)
                exchange.end()
                assert answer is not None
                return _to_response(answer)
        exchange.start()
        setattr(request, EXCHANGE_ATTR, exchange)
        return None

    async def _aprocess_view(
        self, request: HttpRequest, view_func: Any, view_args: Any, view_kwargs: Any
    ) -> HttpResponse | None:
        """Claim the key before the view runs (async stack)."""
        admitted = self._admit(request, view_func)
        if admitted is None or isinstance(admitted, HttpResponse):
            return admitted
        config, neutral, key, body = admitted
        auser = getattr(request, "auser", None)
        neutral.user = await auser() if auser is not None else None
        exchange = AsyncExchange(self._arunner, Flow(config, neutral, key, body))
        label = current_route.set(f"{neutral.method} {neutral.route or neutral.path}")
        try:
            verdict = await exchange.claim()
        finally:
            current_route.reset(label)
        if verdict is RUN_UNPROTECTED:
            return None
        if verdict is not EXECUTE:
            assert isinstance(verdict, Answer)
            return _to_response(verdict)
        if isinstance(exchange.transaction, AsyncDjangoTransaction):
            # The ORM writes of the view must land in the block: enter it before the view runs
            # (a URL store's transaction begins lazily, when the view asks for it).
            try:
                await exchange.transaction.connection()
            except StoreError as exc:
                answer = await exchange.fail(exc, False)
                await exchange.end()
                assert answer is not None
                return _to_response(answer)
        exchange.start()
        setattr(request, EXCHANGE_ATTR, exchange)
        return None

    # -- around the view ---------------------------------------------------------------------

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        try:
            response = self.get_response(request)
        except BaseException as exc:
            exchange = request.__dict__.pop(EXCHANGE_ATTR, None)
            if exchange is None:
                raise
            answer = exchange.fail(exc, False)
            exchange.end()
            if answer is None:
                raise
            return _to_response(answer)
        exchange = request.__dict__.pop(EXCHANGE_ATTR, None)
        if exchange is None:
            return response
        status, headers = _head(response)
        capture = Capture(exchange.flow.config.max_stored_body_size)
        try:
            if response.streaming:
                # Read to the end, so the stored response is whole (and settled before any
                # byte leaves, like the other shells' last chunk).
                chunks = [bytes(chunk) for chunk in response]
                for chunk in chunks:
                    capture.add(chunk)
                response.streaming_content = chunks
            else:
                capture.add(response.content)
        except BaseException as exc:
            answer = exchange.fail(exc, True)
            exchange.end()
            if answer is None:
                raise
            return _to_response(answer)
        try:
            answer = exchange.settle(status, headers, capture.body, capture.omitted)
        finally:
            exchange.end()
        return _added(response, exchange) if answer is None else _to_response(answer)

    async def __acall__(self, request: HttpRequest) -> Any:
        try:
            response = await self.get_response(request)
        except BaseException as exc:
            exchange = request.__dict__.pop(EXCHANGE_ATTR, None)
            if exchange is None:
                raise
            answer = await exchange.fail(exc, False)
            await exchange.end()
            if answer is None:
                raise
            return _to_response(answer)
        exchange = request.__dict__.pop(EXCHANGE_ATTR, None)
        if exchange is None:
            return response
        status, headers = _head(response)
        capture = Capture(exchange.flow.config.max_stored_body_size)
        try:
            if response.streaming:
                if response.is_async:
                    chunks = [bytes(chunk) async for chunk in response.streaming_content]
                else:
                    chunks = [bytes(chunk) for chunk in response]
                for chunk in chunks:
                    capture.add(chunk)
                # An async iterator: Django's ASGI handler warns about consuming a sync one.
                response.streaming_content = _replay_chunks(chunks)
            else:
                capture.add(response.content)
        except BaseException as exc:
            answer = await exchange.fail(exc, True)
            await exchange.end()
            if answer is None:
                raise
            return _to_response(answer)
        try:
            answer = await exchange.settle(status, headers, capture.body, capture.omitted)
        finally:
            await exchange.end()
        return _added(response, exchange) if answer is None else _to_response(answer)
