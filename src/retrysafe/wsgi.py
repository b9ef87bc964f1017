"""Pure WSGI idempotency middleware (PEP 3333; no framework import).

Works in any WSGI app: Flask, Django, Falcon, Pyramid, Bottle, or a bare WSGI callable::

    app = IdempotencyMiddleware(app, store="sqlite:///idempotency.db")

A thin shell, like the ASGI one: it builds the neutral request from the environ, reads
``wsgi.input`` within the limit (chunked input too), captures ``start_response`` and every chunk
of the response iterable, and forwards the flow's answers. Every decision is made by
:mod:`retrysafe._core.http`, performed by the sync runner (generated from the async one).
"""

from __future__ import annotations

import io
import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from http import HTTPStatus
from types import TracebackType
from typing import Any

from ._body import BodyRefused, read_wsgi_body
from ._core.config import IdempotencyConfig, RouteOptions, front_config, front_store
from ._core.drive_sync import drive
from ._core.http import EXECUTE, RUN_UNPROTECTED, Answer, Capture, Flow, admit, notify
from ._core.request import Request, content_length, exact_path, path_of_bytes
from ._core.routes import route_config
from ._core.transaction import CONTEXT_SCOPE_KEY
from ._core.transaction import sync_mark_committed as mark_committed
from ._core.transaction import sync_transaction as transaction
from ._sync.runner import Exchange, Runner
from .stores import Store, resolve_store

__all__ = ["IdempotencyMiddleware", "mark_committed", "request_from_environ", "transaction"]

logger = logging.getLogger("retrysafe")

#: Where a framework integration puts the route template it matched (Flask's
#: ``/orders/<int:order_id>``), for the events' ``route`` (metrics, spans, logs).
ROUTE_KEY = "retrysafe.route"

ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]
StartResponse = Callable[..., Callable[[bytes], Any]]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def request_from_environ(environ: Mapping[str, Any]) -> Request:
    """Build the neutral request from a WSGI environ (its header list is built on first use)."""
    key = environ.get("HTTP_IDEMPOTENCY_KEY")
    length = environ.get("CONTENT_LENGTH", "")
    raw = environ.get("PATH_INFO", "") or "/"
    path = exact = raw
    if not (raw.isascii() and "%" not in raw):
        path, exact = _paths(raw)
    return Request(
        environ.get("REQUEST_METHOD", "GET"),
        path,
        environ.get("QUERY_STRING", "").encode("latin-1"),
        # WSGI joins repeated header fields with commas: the key parser rejects those.
        [] if key is None else [key.encode("latin-1")],
        content_length(length),
        environ.get("CONTENT_TYPE", "").encode("latin-1"),
        environ.get("HTTP_AUTHORIZATION", "").encode("latin-1"),
        environ.get("REMOTE_USER") or None,
        None,
        source=environ,
        find_route=_environ_route,
        find_headers=environ_headers,
        exact_path=exact,
    )


def _environ_route(environ: Mapping[str, Any]) -> str | None:
    route = environ.get(ROUTE_KEY)
    return route if isinstance(route, str) else None


def environ_headers(environ: Mapping[str, Any]) -> list[tuple[bytes, bytes]]:
    """The request headers of a WSGI environ as ``(lower-case name, value)`` byte pairs."""
    headers = [
        (name[5:].replace("_", "-").lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in environ.items()
        if name.startswith("HTTP_")
    ]
    if content_type := environ.get("CONTENT_TYPE", ""):
        headers.append((b"content-type", content_type.encode("latin-1")))
    if length := environ.get("CONTENT_LENGTH", ""):
        headers.append((b"content-length", length.encode("latin-1")))
    return headers


def _paths(raw: str) -> tuple[str, str]:
    # PEP 3333 carries the path as latin-1 text of its bytes; ASGI as UTF-8: decode the same for
    # the request's path. The app sees the bytes, so the record keeps each of them (decoded as
    # UTF-8, every invalid byte would be one U+FFFD).
    try:
        data = raw.encode("latin-1")
    except UnicodeEncodeError:  # already decoded text (a framework's environ, e.g. Django's META)
        return raw, exact_path(raw)
    return data.decode("utf-8", "replace"), path_of_bytes(data)


class IdempotencyMiddleware:
    """Makes POST/PATCH requests that carry an ``Idempotency-Key`` safe to retry (WSGI).

    Args:
        app: the WSGI app to protect.
        store: a store URL (``"sqlite:///idempotency.db"``, ``"redis://..."``) or a synchronous
            store.
        config: the settings; or pass them as keyword arguments instead.
        route_options: given the environ, the :class:`~retrysafe.RouteOptions` of the route the
            request goes to (e.g. what ``@idempotent`` put on the view a framework's URL map
            resolves), or ``None`` for the app-wide settings. Framework integrations pass it.
        **options: fields of :class:`~retrysafe.IdempotencyConfig`.

    Raises:
        ConfigurationError: bad settings or store (at construction, never per request).
    """

    def __init__(
        self,
        app: WSGIApp,
        *,
        store: str | Store,
        config: IdempotencyConfig | None = None,
        route_options: Callable[[dict[str, Any]], RouteOptions | None] | None = None,
        **options: Any,
    ) -> None:
        self.app = app
        self.store = front_store(resolve_store, store)
        self.config = front_config(config, options, self.store)
        self.route_options = route_options
        self._runner = Runner(self.store)
        self._configs: dict[int, IdempotencyConfig] = {}

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        base = self.config
        if environ.get("REQUEST_METHOD") not in base.methods:
            return self.app(environ, start_response)
        config = base
        if self.route_options is not None:
            routed = route_config(self._configs, self.route_options(environ), base)
            if routed is None:  # the route opted out
                return self.app(environ, start_response)
            config = routed
        if not config.required and "HTTP_IDEMPOTENCY_KEY" not in environ:
            return self.app(environ, start_response)  # no key where it is optional: no set-up
        request = request_from_environ(environ)
        admitted = admit(request, config)
        if admitted is None:
            return self.app(environ, start_response)
        if not isinstance(admitted, Answer):
            try:
                body = read_wsgi_body(environ, request.content_length, config)
            except BodyRefused as refused:  # too large, or the client left
                admitted = refused.answer
        if isinstance(admitted, Answer):
            notify(config, admitted.event or "", request, "")
            return _respond(start_response, admitted)
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        exchange = Exchange(self._runner, Flow(config, request, admitted, body))
        verdict = exchange.claim()
        if verdict is EXECUTE:
            return _Execution(self.app, exchange, environ, start_response).run()
        if verdict is RUN_UNPROTECTED:
            return self.app(environ, start_response)
        assert isinstance(verdict, Answer)
        return _respond(start_response, verdict)


def _status_line(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Unknown"


def _native_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers]


def _respond(start_response: StartResponse, answer: Answer) -> list[bytes]:
    start_response(_status_line(answer.status), _native_headers(answer.headers))
    return [answer.body]


class _Execution:
    """The handler of one keyed request: its captured ``start_response`` and the iterable that
    forwards its chunks one behind, so the flow settles before the last one leaves."""

    def __init__(
        self,
        app: WSGIApp,
        exchange: Exchange,
        environ: dict[str, Any],
        start_response: StartResponse,
    ) -> None:
        self.app = app
        self.exchange = exchange
        self.environ = environ
        self.start_response = start_response
        self.status = 0
        self.status_line = ""
        self.headers: list[tuple[str, str]] = []
        self.started = False  # the server's start_response was called
        self.written: list[bytes] = []  # data given to the legacy write() callable
        environ[CONTEXT_SCOPE_KEY] = exchange

    def run(self) -> Iterable[bytes]:
        self.exchange.start()
        body = _Body(self)
        try:
            body.source = self.app(self.environ, self._start_response)
        except BaseException as exc:
            answer = self.exchange.fail(exc, self.status != 0)
            self.end()
            if answer is None:
                raise
            return _respond(self.start_response, answer)
        body.chunks = iter(body.source)
        return body

    def end(self) -> None:
        """The request is over: close what the flow keeps open, and leave no cycle (the
        environ holds the exchange, whose request holds the environ)."""
        try:
            steps = self.exchange.flow.finish()  # exchange.end(), written out: no call when
            if steps is not None:  # nothing is open (the common case)
                drive(steps, self.exchange)
        finally:
            self.environ.pop(CONTEXT_SCOPE_KEY, None)

    def _start_response(
        self, status: str, headers: list[tuple[str, str]], exc_info: ExcInfo | None = None
    ) -> Callable[[bytes], Any]:
        if exc_info is not None and self.started:
            raise exc_info[1].with_traceback(exc_info[2])
        self.status_line = status
        self.status = int(status[:3])
        self.headers = list(headers)
        return self._write

    def _write(self, data: bytes) -> None:
        # The legacy write() callable: its data goes out (and is stored) before the iterable's.
        self.written.append(data)

    def start(self, answer: Answer | None) -> None:
        """Call the server's ``start_response`` (once), with the handler's head or ``answer``."""
        if self.started:
            return
        self.started = True
        if answer is None:
            added = self.exchange.flow.added_headers  # e.g. the retention header
            headers = self.headers + _native_headers(added) if added else self.headers
            self.start_response(self.status_line, headers)
        else:
            self.start_response(_status_line(answer.status), _native_headers(answer.headers))


class _Body:
    """The response iterable the server gets. When the server stops early and calls
    :meth:`close` (the client went away), the handler's iterable is still read to its end and
    its response stored, so the client's retry gets the replay (guarantee 4)."""

    def __init__(self, execution: _Execution) -> None:
        self.execution = execution
        self.hold = execution.exchange.flow.holds_response
        self.source: Iterable[bytes] = ()
        self.chunks: Iterator[bytes] = iter(())
        self.capture = Capture(execution.exchange.flow.config.max_stored_body_size)
        self.pending: list[bytes] = []  # captured, not yet handed to the server
        self.out: deque[bytes] = deque()
        self.answer: Answer | None = None
        self.done = False
        self.source_closed = False

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        execution = self.execution
        while not self.out:
            if self.done:
                if not execution.started:
                    execution.start(self.answer)
                raise StopIteration
            self._pull()
        if not execution.started:
            execution.start(self.answer)
        return self.out.popleft()

    def close(self) -> None:
        """The server is done with the response (PEP 3333): finish the handler if needed."""
        if self.done:
            return
        try:
            while not self.done:
                self._pull()
        except Exception:
            logger.exception("handler of %s failed after its client left", self._record())
        self.out.clear()

    def _pull(self) -> None:
        """Take the next chunk from the handler (or finish), keeping the last one back."""
        try:
            chunk = next(self.chunks)
        except StopIteration:
            self._finish()
            return
        except BaseException as exc:
            self._close_source()
            self.done = True
            answer = self.execution.exchange.fail(exc, True)
            self.execution.end()
            if answer is None or self.execution.started:
                raise
            self.answer = answer
            self.out.append(answer.body)
            return
        written = self.execution.written
        if written:
            for early in written:
                self._capture(early)
            written.clear()
        self._capture(chunk)
        if not self.hold and len(self.pending) > 1:
            self.out.extend(self.pending[:-1])
            del self.pending[:-1]

    def _capture(self, chunk: bytes) -> None:
        if chunk:
            self.capture.add(chunk)
            self.pending.append(chunk)

    def _finish(self) -> None:
        self._close_source()
        for early in self.execution.written:
            self._capture(early)
        self.done = True
        execution = self.execution
        if not execution.status:
            try:
                execution.exchange.incomplete()
            finally:
                execution.end()
            raise RuntimeError("the WSGI app returned without calling start_response")
        try:
            self.answer = execution.exchange.settle(
                execution.status,
                # The names as given: the stored response's encoder lower-cases them.
                [(n.encode("latin-1"), v.encode("latin-1")) for n, v in execution.headers],
                self.capture.body,
                self.capture.omitted,
            )
        finally:
            execution.end()
        if self.answer is not None:
            self.out.append(self.answer.body)
        else:
            self.out.extend(self.pending)
        self.pending = []

    def _close_source(self) -> None:
        if self.source_closed:
            return
        self.source_closed = True
        close = getattr(self.source, "close", None)
        if close is not None:
            close()

    def _record(self) -> str:
        return self.execution.exchange.flow.record_id[:12]
