"""A neutral harness for the wire-contract suite: one logical app on every front.

The same small orders app runs behind the ASGI shell (a Starlette app, driven through
``httpx.ASGITransport`` on an event loop in a background thread), behind the WSGI shell (a
bare WSGI callable, driven through :class:`ServerTransport`, which builds the environ as a WSGI
server does) and behind a framework integration driven through the framework's own test client
(shell ``flask``: Flask views under ``retrysafe.contrib.flask``, see ``flask_front.py``; shells
``django`` and ``django-async``: Django views under ``retrysafe.contrib.django``, see
``django_front.py``; any such front implements :class:`ClientFront` and is named in
:func:`client_front`). Tests talk to every shell through one sync API (:meth:`Service.post`)
and use threads for concurrency, so every test reads the same on every front. (Shell
``aiohttp``: an aiohttp.web app on aiohttp's test server, see ``aiohttp_front.py``.)

The app's one route (any path) counts its runs per path (the "effect") and takes knobs from the
query string:

- ``status=N``: answer with this status (default 201).
- ``hold=1,2``: the first (and second) run of the path waits until the test opens its gate.
- ``sleep=S``: sleep S seconds before answering (without blocking an event loop).
- ``fail=first|always``: raise after the effect (on the first run, or always).
- ``fail=midway``: on the first run, the streamed body raises after its first chunk.
- ``chunks=N``: stream the body in N chunks.
- ``size=N``: answer with a plain body of N bytes.
- ``h=Name:value``: one more response header (repeatable).
- ``mark=1``: declare the effect committed (``retrysafe.mark_committed`` on ASGI,
  ``retrysafe.wsgi.mark_committed`` on WSGI, the framework's own on the others); the result
  lands in ``World.marks``.

Every answer carries ``Location``, ``ETag``, ``X-Custom``, ``Cache-Control`` and ``Set-Cookie``.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Protocol
from urllib.parse import parse_qs, quote, unquote_to_bytes

import httpx
from starlette.applications import Starlette
from starlette.requests import Request as StarletteRequest
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

import retrysafe
import retrysafe.asgi
import retrysafe.wsgi

__all__ = [
    "ASYNC_SHELLS",
    "REPLAYED",
    "ClientFront",
    "CutStream",
    "Pending",
    "ServerTransport",
    "Service",
    "World",
    "WsgiChunks",
    "asgi_scope",
    "cut_asgi",
    "problem_type",
    "wsgi_status",
]

REPLAYED = "idempotency-replayed"
#: Longest a test waits for anything (a gate, a request): bounded, never a hang.
WAIT = 15.0

#: The shells that take the backend's async store; every other shell takes its sync store.
ASYNC_SHELLS = frozenset({"asgi", "django-async", "aiohttp"})

Headers = Sequence[tuple[str | bytes, str | bytes]] | dict[str, str] | None


@dataclass
class World:
    """What the app's instances share: its effects (a database, in a real app) and the gates
    that hold chosen runs of a path."""

    runs: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    gates: dict[int, tuple[threading.Event, threading.Event]] = field(default_factory=dict)
    marks: list[bool] = field(default_factory=list)

    def hit(self, path: str) -> int:
        with self.lock:
            self.runs[path] += 1
            return self.runs[path]

    def __getitem__(self, path: str) -> int:
        with self.lock:
            return self.runs[path]

    def gate(self, run: int) -> tuple[threading.Event, threading.Event]:
        """The (entered, opened) events of the ``run``-th run of a held path."""
        with self.lock:
            if run not in self.gates:
                self.gates[run] = (threading.Event(), threading.Event())
            return self.gates[run]

    def wait_entered(self, run: int = 1) -> None:
        """Wait until the ``run``-th run of a held path is inside the handler."""
        assert self.gate(run)[0].wait(WAIT), f"run {run} never started"

    def open(self, run: int = 1) -> None:
        """Let the ``run``-th run of a held path go on."""
        self.gate(run)[1].set()

    def held(self, run: int) -> None:
        """Called by the handler: wait (bounded) until the test opens this run's gate."""
        entered, opened = self.gate(run)
        entered.set()
        opened.wait(WAIT)


@dataclass
class Plan:
    """What the handler does for one request, decided from its path, query and body."""

    run: int
    status: int
    headers: list[tuple[str, str]]
    chunks: list[bytes]
    hold: bool
    sleep: float
    fail: bool
    midway: bool
    mark: bool


def plan(world: World, path: str, query: str, body: bytes, headers: dict[str, str]) -> Plan:
    """Run the effect (count it) and decide the answer; the same on every front."""
    n = world.hit(path)
    knobs = parse_qs(query)

    def knob(name: str, default: str = "") -> str:
        return knobs.get(name, [default])[0]

    status = int(knob("status", "201"))
    out = [
        ("Location", f"{quote(path)}/{n}"),
        ("ETag", f'"v{n}"'),
        ("X-Custom", f"c{n}"),
        ("Cache-Control", "no-store"),
        ("Set-Cookie", f"session={n}"),
    ]
    for extra in knobs.get("h", []):
        name, _, value = extra.partition(":")
        out.append((name, value))
    if knob("size"):
        payload = b"x" * int(knob("size"))
        out.append(("Content-Type", "text/plain"))
    else:
        doc = {
            "call": n,
            "path": path,
            "sha": hashlib.sha256(body).hexdigest(),
            "len": len(body),
            "auth": headers.get("authorization"),
        }
        payload = json.dumps(doc).encode()
        out.append(("Content-Type", "application/json"))
    if status in (204, 304):
        payload = b""
        out = [(k, v) for k, v in out if k != "Content-Type"]
    parts = int(knob("chunks", "1"))
    if parts > 1:
        step = max(1, -(-len(payload) // parts))
        chunks = [payload[i : i + step] for i in range(0, len(payload), step)]
    else:
        chunks = [payload]
        out.append(("Content-Length", str(len(payload))))
    fail = knob("fail") == "always" or (knob("fail") == "first" and n == 1)
    hold = str(n) in knob("hold").split(",")
    midway = knob("fail") == "midway" and n == 1
    sleep = float(knob("sleep", "0"))
    return Plan(n, status, out, chunks, hold, sleep, fail, midway, knob("mark") == "1")


class HandlerFailed(RuntimeError):
    """What the app raises for ``fail=...``."""


async def streamed(p: Plan) -> AsyncIterator[bytes]:
    """The planned body as an async app streams it (``fail=midway``: failing after a chunk)."""
    for i, chunk in enumerate(p.chunks):
        await asyncio.sleep(0)
        if i == 1 and p.midway:
            raise HandlerFailed("the body failed midway")
        yield chunk


# -- the ASGI front --------------------------------------------------------------------------


def asgi_app(world: World) -> Starlette:
    """The orders app as a Starlette app."""

    async def handle(request: StarletteRequest) -> Response:
        body = await request.body()
        p = plan(world, request.url.path, request.url.query, body, dict(request.headers))
        if p.mark:
            world.marks.append(await retrysafe.mark_committed(request))
        if p.hold:
            # In a worker thread: the event loop (and the lease renewal on it) keeps running.
            await asyncio.to_thread(world.held, p.run)
        if p.sleep:
            await asyncio.sleep(p.sleep)
        if p.fail:
            raise HandlerFailed("the handler failed")
        if len(p.chunks) > 1:
            response: Response = StreamingResponse(streamed(p), status_code=p.status)
        else:
            response = Response(p.chunks[0], status_code=p.status)
        # Every header as planned, repeated fields included (a dict would merge them).
        response.raw_headers = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in p.headers
        ]
        return response

    methods = ["GET", "POST", "PATCH", "PUT"]
    return Starlette(routes=[Route("/{path:path}", handle, methods=methods)])


# -- the WSGI front --------------------------------------------------------------------------


class WsgiChunks:
    """The WSGI app's response iterable; counts its ``close()`` calls (PEP 3333)."""

    def __init__(self, world: World, chunks: list[bytes], midway: bool) -> None:
        self.world = world
        self.chunks = iter(chunks)
        self.midway = midway
        self.sent = 0

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        if self.sent == 1 and self.midway:
            raise HandlerFailed("the body failed midway")
        self.sent += 1
        return next(self.chunks)

    def close(self) -> None:
        self.world.hit("closed")


def wsgi_app(world: World) -> Callable[..., Iterable[bytes]]:
    """The orders app as a bare WSGI callable."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        stream = environ["wsgi.input"]
        length = environ.get("CONTENT_LENGTH", "")
        body = stream.read(int(length)) if length else stream.read()
        headers = {
            k[5:].replace("_", "-").lower(): v for k, v in environ.items() if k.startswith("HTTP_")
        }
        p = plan(world, environ["PATH_INFO"], environ.get("QUERY_STRING", ""), body, headers)
        if p.mark:
            world.marks.append(retrysafe.wsgi.mark_committed(environ))
        if p.hold:
            world.held(p.run)
        if p.sleep:
            time.sleep(p.sleep)
        if p.fail:
            raise HandlerFailed("the handler failed")
        start_response(f"{p.status} {_phrase(p.status)}", p.headers)
        return WsgiChunks(world, p.chunks, p.midway)

    return app


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def wsgi_environ(request: httpx.Request) -> dict[str, Any]:
    """The environ a WSGI server (gunicorn, wsgiref) builds: repeated header fields joined
    with commas, ``Content-Type``/``Content-Length`` without the ``HTTP_`` prefix."""
    request.read()
    environ: dict[str, Any] = {
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": request.url.scheme,
        "wsgi.input": io.BytesIO(request.content),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
        "REQUEST_METHOD": request.method,
        "SCRIPT_NAME": "",
        # PEP 3333: the path as bytes (percent-escapes decoded) in a latin-1 str, as servers do.
        "PATH_INFO": unquote_to_bytes(request.url.raw_path.split(b"?")[0]).decode("latin-1"),
        "QUERY_STRING": request.url.query.decode("ascii"),
        "SERVER_NAME": request.url.host,
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
    }
    for raw_name, raw_value in request.headers.raw:
        name = raw_name.decode("latin-1").upper().replace("-", "_")
        if name not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            name = "HTTP_" + name
        value = raw_value.decode("latin-1")
        environ[name] = f"{environ[name]},{value}" if name in environ else value
    return environ


class ServerTransport(httpx.BaseTransport):
    """Drives a WSGI app as a server does: the environ of :func:`wsgi_environ`, the iterable
    read to its end and then closed, and a plain ``500`` when the app raises (never a crash of
    the test client)."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        environ = wsgi_environ(request)
        head: list[Any] = []

        def start_response(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Any:
            head[:] = [status, headers]
            return lambda data: None

        try:
            result = self.app(environ, start_response)
            try:
                body = b"".join(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
        except Exception:
            return httpx.Response(500, content=b"Internal Server Error")
        assert head, "the app never called start_response"
        status = int(head[0].split()[0])
        headers = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in head[1]]
        return httpx.Response(status, headers=headers, content=body)


class CutStream:
    """The ``wsgi.input`` of a request whose client left after the first bytes of its body:
    the stream then ends, as gunicorn's does, or raises ``OSError`` (``error``), as uWSGI's and
    mod_wsgi's do."""

    def __init__(self, data: bytes, *, error: bool = False) -> None:
        self.data = io.BytesIO(data)
        self.error = error

    def read(self, size: int = -1) -> bytes:
        return self._checked(self.data.read(size), size)

    def readline(self, size: int = -1) -> bytes:
        return self._checked(self.data.readline(size), size)

    def _checked(self, chunk: bytes, size: int) -> bytes:
        if not chunk and size != 0 and self.error:
            raise OSError("client disconnected")
        return chunk


def wsgi_status(app: Callable[..., Iterable[bytes]], environ: dict[str, Any]) -> int:
    """Call a WSGI app as a server does (its iterable read to its end, then closed) and return
    the status it answered."""
    head: list[str] = []

    def start_response(status: str, headers: Any, exc_info: Any = None) -> Any:
        head[:] = [status]
        return lambda data: None

    result = app(environ, start_response)
    try:
        b"".join(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    return int(head[0].split()[0])


# -- fronts driven through a framework's own test client ------------------------------------


class ClientFront(Protocol):
    """A framework's app under its retrysafe integration, driven through the framework's test
    client (shells other than ``asgi`` and ``wsgi``). Safe to call from several threads."""

    #: The WSGI/ASGI middleware the integration installed (tests may look at it).
    middleware: Any

    def send(self, request: httpx.Request) -> httpx.Response:
        """Send the request; the whole response, or an ``httpx`` error for a cut connection."""

    def abandon(self, request: httpx.Request, after: int) -> None:
        """Send the request and go away after ``after`` parts of the response were read."""

    def cut(self, request: httpx.Request, sent: int, error: bool) -> int | None:
        """Send the request whose client leaves after ``sent`` bytes of its body (see
        :meth:`Service.cut`); the status the front answered, ``None`` for no answer."""

    def close(self) -> None:
        """Release what the front holds: not a sync store (the service closes it); an async
        store (an async shell's) is closed by its front, on the front's event loop."""


class _BuildOnly(httpx.BaseTransport):
    """The transport of a client that only builds requests (and so needs no SSL context, which
    a default transport loads at every construction)."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        raise AssertionError("a test-client shell sends its requests through its ClientFront")


def client_front(shell: str, store: Any, world: World, **options: Any) -> ClientFront:
    """The front of a test-client shell (imported on first use: each needs its framework)."""
    if shell == "flask":
        from .flask_front import FlaskFront

        return FlaskFront(store, world, **options)
    if shell == "django":
        from .django_front import DjangoFront

        return DjangoFront(store, world, **options)
    if shell == "django-async":
        from .django_front import DjangoAsyncFront

        return DjangoAsyncFront(store, world, **options)
    if shell == "aiohttp":
        from .aiohttp_front import AiohttpFront

        return AiohttpFront(store, world, **options)
    raise ValueError(f"unknown shell {shell!r}")


# -- one front, one sync API ---------------------------------------------------------------------


class Service:
    """One instance of the orders app behind one shell and one store.

    Args:
        shell: ``"asgi"``, ``"wsgi"`` or a test-client shell of :func:`client_front`.
        store: the store (async for :data:`ASYNC_SHELLS`, sync otherwise), owned (closed) by
            the service.
        world: the effects it shares with other instances.
        **options: fields of :class:`retrysafe.IdempotencyConfig`.
    """

    def __init__(self, shell: str, store: Any, world: World, **options: Any) -> None:
        self.shell = shell
        self.store = store
        self.world = world
        self.loop: asyncio.AbstractEventLoop | None = None
        self.front: ClientFront | None = None
        if shell == "asgi":
            self.middleware: Any = retrysafe.asgi.IdempotencyMiddleware(
                asgi_app(world), store=store, **options
            )
            self.loop = asyncio.new_event_loop()
            self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
            self.thread.start()
            transport = httpx.ASGITransport(app=self.middleware, raise_app_exceptions=False)
            self.async_client = httpx.AsyncClient(transport=transport, base_url="http://test")
        elif shell == "wsgi":
            self.middleware = retrysafe.wsgi.IdempotencyMiddleware(
                wsgi_app(world), store=store, **options
            )
            self.client = httpx.Client(
                transport=ServerTransport(self.middleware), base_url="http://test"
            )
        else:
            self.front = client_front(shell, store, world, **options)
            self.middleware = self.front.middleware
            # Builds the requests only (the same header set as on the other shells): the
            # framework's test client sends them.
            self.client = httpx.Client(transport=_BuildOnly(), base_url="http://test")

    def _run(self, coro: Any) -> Any:
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT)

    def build(
        self,
        path: str = "/orders",
        *,
        key: str | None = None,
        method: str = "POST",
        headers: Headers = None,
        **kwargs: Any,
    ) -> httpx.Request:
        """The request :meth:`post` sends (``key`` becomes an sf-string Idempotency-Key)."""
        raw: list[tuple[bytes, bytes]] = []
        if key is not None:
            raw.append((b"Idempotency-Key", f'"{key}"'.encode()))
        items = headers.items() if isinstance(headers, dict) else (headers or [])
        for name, value in items:
            raw.append(
                (
                    name.encode("latin-1") if isinstance(name, str) else name,
                    value.encode("latin-1") if isinstance(value, str) else value,
                )
            )
        content = kwargs.get("content")
        if self.shell == "asgi" and content is not None and not isinstance(content, bytes | str):
            kwargs["content"] = _async_chunks(content)  # a streamed (chunked) body
        client = self.async_client if self.shell == "asgi" else self.client
        return client.build_request(method, path, headers=raw, **kwargs)

    def post(self, path: str = "/orders", **kwargs: Any) -> httpx.Response:
        """Send one request (POST unless ``method=``) and return the whole response."""
        request = self.build(path, **kwargs)
        if self.shell == "asgi":
            return self._run(self.async_client.send(request))  # type: ignore[no-any-return]
        if self.front is not None:
            return self.front.send(request)
        return self.client.send(request)

    def background(self, path: str = "/orders", **kwargs: Any) -> Pending:
        """Send a request from another thread; :meth:`Pending.result` waits for it."""
        return Pending(lambda: self.post(path, **kwargs))

    def abandon(self, path: str = "/orders", *, after: int, **kwargs: Any) -> None:
        """Send a request whose client goes away mid-response, after ``after`` parts of it
        reached the client (ASGI: messages sent before send fails, the server reporting the
        disconnect; WSGI: chunks read before the server calls ``close()`` on the iterable; a
        test-client shell: body parts read before the test client's response is closed)."""
        request = self.build(path, **kwargs)
        if self.shell == "asgi":
            self._run(self._abandon_asgi(request, after))
            return
        if self.front is not None:
            self.front.abandon(request, after)
            return
        environ = wsgi_environ(request)
        result = self.middleware(environ, lambda status, headers, exc_info=None: None)
        chunks = iter(result)
        for _ in range(after):
            next(chunks, None)
        result.close()

    def cut(
        self, path: str = "/orders", *, sent: int, error: bool = False, **kwargs: Any
    ) -> int | None:
        """Send a request whose client leaves after ``sent`` bytes of its body (its whole length
        declared in ``Content-Length``). ASGI: the server reports ``http.disconnect``; WSGI
        and the test-client shells: ``wsgi.input`` ends early, or raises ``OSError`` where
        ``error`` is set. Returns the status the shell answered (``None``: no answer)."""
        request = self.build(path, **kwargs)
        if self.shell == "asgi":
            scope = asgi_scope(request)
            return self._run(cut_asgi(self.middleware, scope, request.read()[:sent]))  # type: ignore[no-any-return]
        if self.front is not None:
            return self.front.cut(request, sent, error)
        environ = wsgi_environ(request)
        environ["wsgi.input"] = CutStream(request.content[:sent], error=error)
        return wsgi_status(self.middleware, environ)

    async def _abandon_asgi(self, request: httpx.Request, after: int) -> None:
        body = request.read()
        scope = asgi_scope(request)
        delivered = False
        sent = 0

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal sent
            sent += 1
            if sent > after:
                raise OSError("client disconnected")

        await self.middleware(scope, receive, send)

    def close(self) -> None:
        """Close the client and the store; stop the event loop."""
        if self.loop is None:
            if self.front is not None:
                self.front.close()
            self.client.close()
            if self.shell not in ASYNC_SHELLS:
                self.store.close()
            return
        self._run(self._aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT)
        self.loop.close()

    async def _aclose(self) -> None:
        await self.async_client.aclose()
        # The lease keeper's sweeper and any background completion end with the loop.
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.store.aclose()


def asgi_scope(request: httpx.Request) -> dict[str, Any]:
    """The HTTP scope an ASGI server builds for ``request``."""
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": "http",
        "path": request.url.path,
        "raw_path": request.url.raw_path,
        "root_path": "",
        "query_string": request.url.query,
        "headers": [(n.lower(), v) for n, v in request.headers.raw],
        "server": ("test", 80),
        "client": ("127.0.0.1", 50000),
    }


async def cut_asgi(app: Any, scope: dict[str, Any], part: bytes) -> int | None:
    """Call an ASGI app with a request whose client leaves after ``part`` of its body (the
    server then reports ``http.disconnect``); the status the app answered, ``None``: none."""
    messages = [{"type": "http.request", "body": part, "more_body": True}]
    messages.append({"type": "http.disconnect"})
    out: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if len(messages) > 1 else messages[0]

    async def send(message: dict[str, Any]) -> None:
        out.append(message)

    await app(scope, receive, send)
    return out[0]["status"] if out else None


async def _async_chunks(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


class Pending:
    """A request running in a thread of its own."""

    def __init__(self, send: Callable[[], httpx.Response]) -> None:
        self._result: httpx.Response | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(send,), daemon=True)
        self._thread.start()

    def _run(self, send: Callable[[], httpx.Response]) -> None:
        try:
            self._result = send()
        except BaseException as exc:  # re-raised in the test's thread
            self._error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> httpx.Response:
        self._thread.join(WAIT)
        assert not self._thread.is_alive(), "the request did not finish in time"
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


def problem_type(response: httpx.Response) -> str:
    """The RFC 9457 type slug of an error response (asserting it is a complete problem)."""
    assert response.headers["content-type"] == "application/problem+json"
    data = json.loads(response.content)
    assert data["status"] == response.status_code
    assert data["title"] and data["detail"]
    value: str = data["type"]
    return value.rsplit(":", 1)[-1]
