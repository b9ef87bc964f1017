"""Pure ASGI idempotency middleware (no Starlette import needed).

Works in any ASGI app (Starlette, FastAPI, Litestar, a bare ASGI callable)::

    app = IdempotencyMiddleware(app, store="sqlite:///idempotency.db")

A thin shell: it translates ASGI to the neutral request, reads the body within the limit and
captures the response through a send hook; :mod:`retrysafe._core.http` decides everything else.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ._asgi_routes import RouteTable, route_template, routes_owner
from ._asgi_startup import start_up_checks
from ._async.runner import AsyncExchange, AsyncRunner
from ._body import BodyRefused, read_asgi_body
from ._core.codec import RawHeaders
from ._core.config import IdempotencyConfig, front_config, front_store
from ._core.drive import drive
from ._core.http import EXECUTE, RUN_UNPROTECTED, Answer, Flow, admit, notify, too_large
from ._core.request import Request, content_length, exact_path
from ._core.transaction import CONTEXT_SCOPE_KEY
from .stores import AsyncStore, Store, resolve_async_store

__all__ = ["IdempotencyMiddleware"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Any, Receive, Send], Awaitable[None]]

#: Handlers that outlive their cancelled request; kept here so they are not garbage-collected.
_detached: set[asyncio.Future[None]] = set()


def _forget(task: asyncio.Future[None]) -> None:
    _detached.discard(task)
    if not task.cancelled() and (error := task.exception()) is not None:
        # The key was released; the client that could see the error is gone.
        logging.getLogger("retrysafe").error("detached handler failed", exc_info=error)


def request_from_scope(scope: Scope, find_route: Callable[[Any], Any] = route_template) -> Request:
    """Build the neutral request from an ASGI HTTP scope, in one pass over its headers."""
    headers = scope["headers"]
    keys: list[bytes] = []
    length = content_type = b""
    authorization: bytes | None = None
    for name, value in headers:
        if name == b"idempotency-key":
            keys.append(value)
        elif name == b"content-length":
            length = value
        elif name == b"content-type":
            content_type = value
        elif name == b"authorization":
            # Repeated fields: all of them, as a WSGI server joins them (a framework may read
            # the first); a line feed cannot occur in a field value, so the join is exact.
            authorization = value if authorization is None else authorization + b"\n" + value
    method, path, query = scope["method"], scope["path"], scope.get("query_string", b"")
    raw_path = scope.get("raw_path") or b""
    exact = path
    if not (raw_path.isascii() and b"%" not in raw_path and path.isascii() and "%" not in path):
        exact = exact_path(path, raw_path)  # a%2Fb is not a/b, %FF is not %FE
    return Request(
        method, path, query, keys, content_length(length), content_type, authorization or b"",
        scope.get("user"), headers, source=scope, find_route=find_route, exact_path=exact,
    )  # fmt: skip


class IdempotencyMiddleware:
    """Makes POST/PATCH requests that carry an ``Idempotency-Key`` safe to retry.

    Args:
        app: the ASGI app to protect.
        store: a store URL (``"sqlite:///idempotency.db"``, ``"redis://..."``), an async store,
            or a local synchronous store (memory, SQLite).
        config: the settings; or pass them as keyword arguments instead.
        **options: fields of :class:`~retrysafe.IdempotencyConfig`.

    Raises:
        ConfigurationError: bad settings or store (at construction, never per request).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: str | AsyncStore | Store,
        config: IdempotencyConfig | None = None,
        **options: Any,
    ) -> None:
        self.app = app
        with start_up_checks(self):  # a bad setting raises here, unless Starlette builds lazily
            self.store = front_store(resolve_async_store, store)
            self.config = front_config(config, options, self.store)
            self._runner = AsyncRunner(self.store)
            self._routes = RouteTable(routes_owner(app))
            self._find_route = self._routes.template

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in self.config.methods:
            await self.app(scope, receive, send)
            return
        config = self._routes.config(scope, self.config)
        if config is not None and not config.required:
            for name, _ in scope["headers"]:  # no key on a route where it is optional: pass,
                if name == b"idempotency-key":  # before any set-up (the common case)
                    break
            else:
                config = None
        if config is None:  # the route opted out, or no key to protect
            await self.app(scope, receive, send)
            return
        request = request_from_scope(scope, self._find_route)
        admitted = admit(request, config)
        assert admitted is not None  # no key where it is optional passed through above
        if not isinstance(admitted, Answer):
            message = await receive()  # the whole body in one message: the common case
            if message["type"] == "http.request" and not message.get("more_body", False):
                body = message.get("body", b"")
                if len(body) > config.max_body_size:
                    admitted = too_large(config)
            else:
                try:
                    body = await read_asgi_body(message, receive, config)
                except BodyRefused as refused:  # too large, or the client left
                    admitted = refused.answer
        if isinstance(admitted, Answer):
            notify(config, admitted.event or "", request, "")
            await _send_answer(send, admitted)
            return
        execution = _Execution(self._runner, Flow(config, request, admitted, body))
        verdict = await execution.claim()
        if verdict is EXECUTE:
            await execution.run(self.app, scope, receive, send, body)
        elif verdict is RUN_UNPROTECTED:
            await self.app(scope, _body_then(receive, body), send)
        else:
            assert isinstance(verdict, Answer)
            await _send_answer(send, verdict)


async def _send_answer(send: Send, answer: Answer) -> None:
    start = {"type": "http.response.start", "status": answer.status, "headers": answer.headers}
    try:
        await send(start)
        await send({"type": "http.response.body", "body": answer.body, "more_body": False})
    except OSError:
        pass  # the client went away; nothing is lost (nothing ran, or the record is stored)


def _body_then(receive: Receive, body: bytes) -> Receive:
    """The app's receive when it runs unprotected (fail-open): the body, then the server's."""
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def app_receive() -> Any:
        return messages.pop() if messages else await receive()

    return app_receive


class _Execution(AsyncExchange):
    """One keyed request: the exchange that drives its flow, and the handler run with a send hook
    that captures its response and settles before the last body chunk is forwarded."""

    __slots__ = (
        "app", "body", "chunks", "client_gone", "headers", "held", "omitted", "receive", "room",
        "scope", "send", "settled", "status",
    )  # fmt: skip

    def run(
        self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, body: bytes
    ) -> Awaitable[None]:
        self.app, self.scope, self.receive, self.send = app, scope, receive, send
        self.body: bytes | None = body
        self.status = 0
        self.headers: RawHeaders = ()
        # The body as stored (a Capture written out): each chunk while there is room, else none.
        self.chunks: list[bytes] = []
        self.room = self.flow.config.max_stored_body_size
        self.settled = self.client_gone = self.omitted = False
        # Transactional mode: nothing leaves before the commit, which may still fail.
        self.held: list[Message] | None = [] if self.flow.holds_response else None
        scope[CONTEXT_SCOPE_KEY] = self
        return self._detached() if self._detach() else self._run()

    async def _detached(self) -> None:
        # The handler runs in its own task: when the server cancels this request (the client
        # went away), the handler still finishes and its response is stored (guarantee 4).
        task = asyncio.ensure_future(self._run())
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                raise
            self.client_gone = True
            _detached.add(task)
            task.add_done_callback(_forget)
            raise

    async def _run(self) -> None:
        self.start()
        try:  # not a `finally` (see AsyncCallRun.invoke)
            try:
                await self.app(self.scope, self._receive, self._send)
            except BaseException as exc:
                if self.settled:
                    raise
                answer = await self.fail(exc, self.status != 0)
                if answer is None:
                    raise exc  # by name (see AsyncCallRun.invoke)
                await self._forward_answer(answer)
            else:
                if not self.settled:
                    await self.incomplete()
        except BaseException as exc:
            await self.end()
            del self.scope[CONTEXT_SCOPE_KEY]
            raise exc
        steps = self.flow.finish()  # end(), written out: no coroutine when nothing is open
        if steps is not None:
            await drive(steps, self)
        del self.scope[CONTEXT_SCOPE_KEY]  # the request holds the scope: leave no cycle

    def _detach(self) -> bool:
        mode = self.flow.config.detach_handler
        if mode == "auto":
            # uvicorn never cancels a request whose client left (it reports http.disconnect): no
            # task. Told by receive: frameworks wrap send (Starlette does), not the receive.
            server = getattr(self.receive, "__self__", None)
            return not type(server).__module__.startswith("uvicorn.")
        return mode == "always"

    async def _receive(self) -> Message:
        if self.body is not None:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        message: Message = await self.receive()
        if message["type"] == "http.disconnect":
            # A protected handler runs to completion so its response is stored (guarantee 4);
            # Starlette's StreamingResponse would otherwise stop at the disconnect.
            self.client_gone = True
            await asyncio.Event().wait()
        return message

    async def _send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status, self.headers = message["status"], message.get("headers", [])
            if self.flow.added_headers:  # e.g. the retention header
                message = {**message, "headers": [*self.headers, *self.flow.added_headers]}
        elif kind == "http.response.body":
            chunk = message.get("body", b"")
            if chunk and not self.omitted:
                self.room -= len(chunk)
                if self.room < 0:
                    self.omitted = True
                    self.chunks.clear()
                else:
                    self.chunks.append(chunk)
            if not message.get("more_body", False) and not self.settled:
                self.settled = True
                chunks = self.chunks
                body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                # Settle before the last byte leaves, so a client that got the answer and
                # retries at once is replayed, never told "in progress".
                answer = await self.settle(self.status, self.headers, body, self.omitted)
                held, self.held = self.held, None
                if answer is not None:
                    await self._forward_answer(answer)
                    return
                for early in held or ():
                    await self._forward(early)
        if self.held is not None:
            self.held.append(message)
        elif not self.client_gone:
            try:  # _forward, inline: this runs for every message of every keyed response
                await self.send(message)
            except OSError:
                self.client_gone = True

    async def _forward(self, message: Message) -> None:
        if self.client_gone:
            return
        try:
            await self.send(message)
        except OSError:  # the client went away: its retry gets the stored replay (guarantee 4)
            self.client_gone = True

    async def _forward_answer(self, answer: Answer) -> None:
        self.held = None
        if not self.client_gone:
            await _send_answer(self.send, answer)
