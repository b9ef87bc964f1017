"""Tools for testing your own idempotent endpoints (pytest, unittest, or none).

- :class:`Clock`: a clock your test moves by hand; pass it to a store (``MemoryStore(clock=...)``)
  and leases, retention (``ttl``) and the ``Retry-After`` of in-progress answers follow it, with
  no sleeping.
- :func:`memory_store`: a fresh in-process store on such a clock.
- :func:`assert_replayed` and :func:`assert_problem`: check what a client received, on responses
  of httpx, requests, Flask's and Django's test clients.
- :func:`send_duplicates` / :func:`asend_duplicates`: fire N identical requests with one key at an
  ASGI or WSGI app at the same time, and get every response.
- :func:`idempotency_disabled`: run a block (or, with the pytest plugin's ``--retrysafe-disable``,
  a whole test run) with idempotency handling turned off.

The pytest plugin (:mod:`retrysafe.testing.pytest_plugin`, loaded automatically when retrysafe is
installed) only adds fixtures and one command-line option: it does nothing until a test asks for
one of its fixtures.

Importing this module imports no web framework and no HTTP client; the duplicate senders import
httpx when called (``pip install 'retrysafe[httpx]'``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
import json
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from .._core.config import DEFAULT_REPLAY_HEADER_DENYLIST
from .._core.problems import PROBLEMS, PROXY_PROBLEMS
from ..stores.memory import MemoryStore

if TYPE_CHECKING:
    import httpx

__all__ = [
    "Clock",
    "DuplicateRequests",
    "asend_duplicates",
    "assert_problem",
    "assert_replayed",
    "idempotency_disabled",
    "memory_store",
    "send_duplicates",
]

#: Headers that legitimately differ between a first response and its replay: never stored
#: (credentials, cookies, hop-by-hop, ``Date``/``Server``), or set on the replay only.
_NOT_REPLAYED = DEFAULT_REPLAY_HEADER_DENYLIST | {
    "idempotency-replayed",
    "idempotent-replayed",
    "idempotency-body-omitted",
}


class Clock:
    """A clock that stands still until the test moves it.

    Pass it as ``clock=`` to a store (:class:`~retrysafe.stores.MemoryStore`,
    :class:`~retrysafe.stores.SQLiteStore`, the Django ORM store): a lease runs out, a completed
    record expires and an in-progress answer's ``Retry-After`` shrinks when the test calls
    :meth:`advance`, never by itself.

    Args:
        start: the time it shows first, in seconds since the epoch.

    Example::

        clock = Clock()
        store = MemoryStore(clock=clock)
        ...
        clock.advance(31)   # the 30 s lease of a crashed request has run out
    """

    __slots__ = ("now",)

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        """The time it shows, in seconds since the epoch."""
        return self.now

    def advance(self, seconds: float) -> float:
        """Move the clock forward by ``seconds``.

        Returns:
            The new time.

        Raises:
            ValueError: ``seconds`` is negative (time does not go back for a store).
        """
        if seconds < 0:
            raise ValueError(f"a clock only moves forward, got {seconds!r}")
        self.now += seconds
        return self.now

    def __repr__(self) -> str:
        return f"Clock(now={self.now!r})"


def memory_store(clock: Callable[[], float] | None = None) -> MemoryStore:
    """A fresh in-process store, optionally on a test clock.

    It works behind every front: the ASGI middleware (FastAPI, Starlette...), the WSGI middleware,
    Flask's extension and Django's ``RETRYSAFE = {"STORE": store}``.

    Args:
        clock: a :class:`Clock` (or any callable returning seconds); default: the real time.
    """
    return MemoryStore() if clock is None else MemoryStore(clock=clock)


# -- what a client received -----------------------------------------------------------------


def _headers(response: Any) -> list[tuple[str, str]]:
    """Every header field of a response as (lower-case name, value), in order, repeats kept."""
    headers = getattr(response, "headers", None)
    if headers is None:
        raise TypeError(f"not an HTTP response: {type(response).__name__}")
    if hasattr(headers, "multi_items"):  # httpx
        pairs = headers.multi_items()
    elif hasattr(headers, "to_wsgi_list"):  # werkzeug (Flask)
        pairs = headers.to_wsgi_list()
    else:  # Django's HttpResponse, requests, a plain mapping
        pairs = list(headers.items())
    return [(str(name).lower(), str(value)) for name, value in pairs]


def _header(response: Any, name: str) -> str | None:
    for field, value in _headers(response):
        if field == name:
            return value
    return None


def _status(response: Any) -> int:
    status = getattr(response, "status_code", None)
    if not isinstance(status, int):
        raise TypeError(f"not an HTTP response: {type(response).__name__}")
    return status


def _body(response: Any) -> bytes:
    """The whole body (Django's streaming responses are read and kept readable)."""
    if getattr(response, "streaming", False) and hasattr(response, "streaming_content"):
        body = b"".join(bytes(chunk) for chunk in response.streaming_content)
        response.streaming_content = [body]
        return body
    if hasattr(response, "get_data"):  # werkzeug (Flask)
        data: bytes = response.get_data()
        return data
    content = getattr(response, "content", None)
    if isinstance(content, bytes):
        return content
    raise TypeError(f"cannot read the body of a {type(response).__name__}")


def _describe(response: Any) -> str:
    body = _body(response)
    shown = body[:200].decode("utf-8", "replace") + ("..." if len(body) > 200 else "")
    return f"{_status(response)} {shown!r}"


def assert_replayed(
    first: Any, second: Any, *, replay_header: str = "Idempotency-Replayed"
) -> None:
    """Assert that ``second`` is the stored replay of ``first``.

    Checks what a client relies on: ``first`` ran (it carries no replay mark), ``second`` carries
    ``Idempotency-Replayed: true``, and both have the same status, body and stored headers
    (``Location``, ``Content-Type``, ``ETag``...). Headers that are never stored (cookies,
    credentials, hop-by-hop, ``Date``, ``Server``) may differ.

    Args:
        first: the response to the first request (httpx, requests, Flask or Django response).
        second: the response to its retry.
        replay_header: the replay mark to look for (``replay_headers`` of the configuration).

    Raises:
        AssertionError: with what differs.
    """
    mark = replay_header.lower()
    if _header(first, mark) is not None:
        raise AssertionError(
            f"the first response is itself a replay ({replay_header}: {_header(first, mark)})"
        )
    if (_header(second, mark) or "").lower() != "true":
        raise AssertionError(
            f"the second response is not a replay (no {replay_header}: true): "
            f"{_describe(second)}; the first was {_describe(first)}"
        )
    if _status(first) != _status(second):
        raise AssertionError(f"status {_status(first)} replayed as {_status(second)}")
    omitted = (_header(second, "idempotency-body-omitted") or "").lower() == "true"
    if not omitted and _body(first) != _body(second):
        raise AssertionError(
            f"body differs: first {_body(first)[:200]!r}, replay {_body(second)[:200]!r}"
        )
    skip = _NOT_REPLAYED | {mark}
    if omitted:
        skip = skip | {"content-length"}
    kept = sorted((n, v) for n, v in _headers(first) if n not in skip)
    replayed = sorted((n, v) for n, v in _headers(second) if n not in skip)
    missing = [f"{n}: {v}" for n, v in kept if (n, v) not in replayed]
    if missing:
        raise AssertionError(f"headers of the first response not replayed: {missing}")


def assert_problem(
    response: Any, slug: str, *, status: int | None = None, retry_after: int | None = None
) -> dict[str, Any]:
    """Assert that ``response`` is retrysafe's RFC 9457 problem ``slug``.

    Checks the ``application/problem+json`` content type, the ``type`` (ending in ``slug``,
    whatever ``problem_type_base`` is), the ``code`` member and the status.

    Args:
        response: an httpx, requests, Flask or Django response.
        slug: the problem type, e.g. ``"idempotency-key-reused"``.
        status: the expected status (default: the status of that problem type).
        retry_after: when given, the ``Retry-After`` header must be this many seconds.

    Returns:
        The problem's JSON body, for further checks (``detail``...).

    Raises:
        AssertionError: with what differs.
        ValueError: ``slug`` is not a problem type retrysafe answers with.
    """
    problem = PROBLEMS.get(slug) or PROXY_PROBLEMS.get(slug)
    if problem is None:
        known = ", ".join(sorted({*PROBLEMS, *PROXY_PROBLEMS}))
        raise ValueError(f"unknown problem type {slug!r}; known: {known}")
    expected = problem.status if status is None else status
    content_type = (_header(response, "content-type") or "").split(";")[0].strip()
    if content_type != "application/problem+json":
        raise AssertionError(
            f"expected problem {slug!r}, got a {content_type or 'typeless'} response: "
            f"{_describe(response)}"
        )
    try:
        data = json.loads(_body(response))
    except ValueError as exc:
        raise AssertionError(f"problem body is not JSON: {_describe(response)}") from exc
    kind = str(data.get("type", ""))
    if not (kind == slug or kind.endswith((":" + slug, "/" + slug))):
        raise AssertionError(f"expected problem {slug!r}, got type {kind!r}: {data}")
    if data.get("code") != problem.code:
        raise AssertionError(f"expected code {problem.code!r}, got {data.get('code')!r}")
    if _status(response) != expected or data.get("status") != expected:
        raise AssertionError(
            f"expected status {expected}, got {_status(response)} (body says {data.get('status')})"
        )
    if retry_after is not None:
        got = _header(response, "retry-after")
        if got != str(retry_after):
            raise AssertionError(f"expected Retry-After: {retry_after}, got {got!r}")
    result: dict[str, Any] = data
    return result


# -- many duplicates at once ------------------------------------------------------------------


def _is_asgi(app: Any) -> bool:
    if inspect.iscoroutinefunction(app):
        return True
    return callable(app) and inspect.iscoroutinefunction(type(app).__call__)


class DuplicateRequests(TypedDict, total=False):
    """What :func:`send_duplicates` and :func:`asend_duplicates` send, each optional.

    Attributes:
        n: how many requests (default 10).
        key: the ``Idempotency-Key`` value (quoted as an sf-string); default a new UUID, unless
            ``headers`` carries one.
        headers: more request headers.
        json: a JSON body.
        content: a raw body (when ``json`` is not given).
        base_url: scheme and host the requests go to (default ``"http://testserver"``).
    """

    n: int
    key: str | None
    headers: Mapping[str, str] | None
    json: Any
    content: bytes | str | None
    base_url: str


def _prepared(sender: str, request: DuplicateRequests) -> tuple[int, str, dict[str, Any]]:
    """``(n, base_url, keyword arguments of each httpx request)`` of a duplicate sender's
    ``request``; an unknown keyword is the ``TypeError`` a plain signature would raise."""
    unknown = request.keys() - DuplicateRequests.__optional_keys__
    if unknown:
        raise TypeError(f"{sender}() got an unexpected keyword argument {min(unknown)!r}")
    sent = dict(request.get("headers") or {})
    if not any(name.lower() == "idempotency-key" for name in sent):
        sent["Idempotency-Key"] = f'"{request.get("key") or uuid.uuid4()}"'
    kwargs: dict[str, Any] = {"headers": sent}
    if request.get("json") is not None:
        kwargs["json"] = request["json"]
    elif request.get("content") is not None:
        kwargs["content"] = request["content"]
    return request.get("n", 10), request.get("base_url", "http://testserver"), kwargs


def _httpx() -> Any:
    try:
        import httpx
    except ImportError as exc:  # pragma: no cover - the extra is part of the test setup
        raise ImportError("send_duplicates needs httpx: pip install 'retrysafe[httpx]'") from exc
    return httpx


async def asend_duplicates(
    app: Any, method: str, path: str, **request: Unpack[DuplicateRequests]
) -> list[httpx.Response]:
    """Send ``n`` identical requests with one key to an ASGI app at once, from a running loop.

    The requests run concurrently on the current event loop (httpx's ASGI transport), so they
    meet each other wherever the app awaits. Use it inside ``async def`` tests; elsewhere
    :func:`send_duplicates`.

    Args:
        app: the ASGI app (FastAPI, Starlette, Litestar, Django's ASGI handler...).
        method: ``"POST"``, ``"PATCH"``...
        path: the path (and query), e.g. ``"/orders"``.
        **request: what to send (:class:`DuplicateRequests`: ``n``, ``key``, ``headers``,
            ``json``, ``content``, ``base_url``).

    Returns:
        The ``n`` responses, in the order the requests were made.
    """
    if not _is_asgi(app):
        raise TypeError("asend_duplicates takes an ASGI app; use send_duplicates for WSGI")
    n, base_url, kwargs = _prepared("asend_duplicates", request)
    http = _httpx()
    transport = http.ASGITransport(app=app)
    async with http.AsyncClient(transport=transport, base_url=base_url) as client:
        responses: list[httpx.Response] = await asyncio.gather(
            *(client.request(method, path, **kwargs) for _ in range(n))
        )
    return responses


def send_duplicates(
    app: Any,
    method: str,
    path: str,
    *,
    timeout: float = 30.0,
    **request: Unpack[DuplicateRequests],
) -> list[httpx.Response]:
    """Send ``n`` identical requests with one key to an ASGI or WSGI app at once.

    A WSGI app (Flask, Django, any PEP 3333 callable) gets ``n`` threads released together; an
    ASGI app gets ``n`` concurrent requests on a new event loop (inside a running loop, await
    :func:`asend_duplicates` instead).

    Args:
        app: the app; ASGI or WSGI is told from its ``__call__``.
        method: ``"POST"``, ``"PATCH"``...
        path: the path (and query), e.g. ``"/orders"``.
        timeout: seconds to wait for every WSGI response.
        **request: what to send (:class:`DuplicateRequests`: ``n``, ``key``, ``headers``,
            ``json``, ``content``, ``base_url``).

    Returns:
        The ``n`` responses, in the order the requests were made.

    Raises:
        RuntimeError: an ASGI app from inside a running event loop.
    """
    if _is_asgi(app):
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(asend_duplicates(app, method, path, **request))
        raise RuntimeError(
            "send_duplicates was called inside a running event loop: await asend_duplicates()"
        )
    n, base_url, kwargs = _prepared("send_duplicates", request)
    http = _httpx()
    start = threading.Barrier(n)
    results: list[Any] = [None] * n

    def one(index: int) -> None:
        transport = http.WSGITransport(app=app)
        with http.Client(transport=transport, base_url=base_url) as client:
            start.wait(timeout)
            try:
                results[index] = client.request(method, path, **kwargs)
            except BaseException as exc:  # reported below, in the caller's thread
                results[index] = exc

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    for index, result in enumerate(results):
        if isinstance(result, BaseException):
            raise RuntimeError(f"duplicate {index} failed: {result!r}") from result
        if result is None:
            raise TimeoutError(f"duplicate {index} got no response within {timeout} s")
    return results


# -- turning idempotency off --------------------------------------------------------------------

_disabled_lock = threading.Lock()
_disabled_depth = 0
_restore: list[Callable[[], None]] = []


def _patch(owner: Any, name: str, replacement: Any) -> None:
    original = owner.__dict__[name]
    setattr(owner, name, replacement)
    _restore.append(lambda: setattr(owner, name, original))


def _disable() -> None:
    from .. import asgi, wsgi

    async def asgi_passthrough(self: Any, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)

    def wsgi_passthrough(self: Any, environ: Any, start_response: Any) -> Any:
        return self.app(environ, start_response)

    _patch(asgi.IdempotencyMiddleware, "__call__", asgi_passthrough)
    _patch(wsgi.IdempotencyMiddleware, "__call__", wsgi_passthrough)
    _disable_functions()
    django_loaded = "retrysafe.contrib.django.middleware" in sys.modules
    if django_loaded or importlib.util.find_spec("django") is not None:
        _disable_django()


def _disable_functions() -> None:
    from ..calls import Delivery, IdempotentFunction

    def call_passthrough(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self.passthrough(args, kwargs)

    # Every message front (the consumer, Celery, Dramatiq...) runs a delivery through these.
    def deliver_passthrough(self: Any, args: Any, kwargs: Any, **_: Any) -> Delivery:
        return Delivery("executed", self.passthrough(args, kwargs))

    async def adeliver_passthrough(self: Any, args: Any, kwargs: Any, **_: Any) -> Delivery:
        return Delivery("executed", await self.passthrough(args, kwargs))

    _patch(IdempotentFunction, "__call__", call_passthrough)
    _patch(IdempotentFunction, "deliver", deliver_passthrough)
    _patch(IdempotentFunction, "adeliver", adeliver_passthrough)


def _disable_django() -> None:
    from ..contrib.django import middleware

    cls = middleware.IdempotencyMiddleware
    original_init = cls.__init__

    def sync_skip(request: Any, view: Any, args: Any, kwargs: Any) -> None:
        return None

    async def async_skip(request: Any, view: Any, args: Any, kwargs: Any) -> None:
        return None

    def init(self: Any, get_response: Any) -> None:
        original_init(self, get_response)
        # Django reads process_view off the instance when it loads its middleware, in the mode
        # of the stack: a coroutine function for an async stack.
        async_mode = inspect.iscoroutinefunction(self.process_view)
        self.process_view = async_skip if async_mode else sync_skip

    _patch(cls, "__init__", init)


@contextlib.contextmanager
def idempotency_disabled() -> Iterator[None]:
    """Turn idempotency handling off inside the block, on every front.

    Every request reaches its handler, and every call of an :func:`~retrysafe.idempotent_function`
    its function, as does every delivery of a :class:`~retrysafe.consumer.MessageHandler`, a
    Celery ``@idempotent_task`` (called, ``.delay()``/``.apply()`` in eager mode, or in a worker)
    and a Dramatiq ``idempotent=`` actor, as if retrysafe were not installed: no key is checked,
    nothing is reserved, stored or replayed. Middleware built
    before the block is covered too, except Django's, which Django builds when its handler loads
    (a test client's first request): enter the block before that. :func:`retrysafe.transaction`
    has no transaction to give then (pass ``optional=True`` in handlers that must run either
    way); :func:`retrysafe.mark_committed` is a no-op.

    Blocks may nest, and are safe to enter from several threads of one test run.
    """
    global _disabled_depth
    with _disabled_lock:
        if _disabled_depth == 0:
            _disable()
        _disabled_depth += 1
    try:
        yield
    finally:
        with _disabled_lock:
            _disabled_depth -= 1
            if _disabled_depth == 0:
                while _restore:
                    _restore.pop()()
