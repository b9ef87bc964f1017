"""Forwarding: the upstream client, streaming both ways, the commit mark before the first byte."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from .._core.errors import ConfigurationError
from .._core.problems import render_problem
from .._core.transaction import CONTEXT_SCOPE_KEY, mark_committed, outcome_known
from .settings import ProxySettings

if TYPE_CHECKING:
    import httpx

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]

logger = logging.getLogger("retrysafe.proxy")


#: RFC 9110 section 7.6.1 connection-specific fields (plus the legacy ones still seen), never
#: forwarded in either direction; fields named in ``Connection`` are dropped too.
HOP_BY_HOP: frozenset[bytes] = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        # The proxy does not relay 100-continue: it reads the body itself.
        b"expect",
    }
)
_FORWARDING: frozenset[bytes] = frozenset(
    {b"forwarded", b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host", b"x-real-ip"}
)
#: How long an idle pooled upstream connection is kept. Shorter than the usual server keep-alive
#: (uvicorn, Node.js: 5 s): an upstream closing an idle connection while the proxy writes on it
#: would turn an innocent request into an ambiguous one.
_KEEPALIVE_EXPIRY = 2.0


class _MarkFailed(Exception):
    """The store could not record the mark: the request must not leave."""


class _ClientGone(Exception):
    """The client went away while its request body streamed."""


class UpstreamProxy:
    """ASGI app that forwards every HTTP request to the upstream and streams the answer back.

    Args:
        settings: the proxy settings.

    Raises:
        ConfigurationError: httpx is not installed.
    """

    def __init__(self, settings: ProxySettings) -> None:
        try:
            import httpx
        except ImportError as exc:  # pragma: no cover - the extra is installed in tests
            raise ConfigurationError(
                f"retrysafe proxy needs: pip install 'retrysafe[proxy]' ({exc})"
            ) from exc
        # Kept as attributes: httpx stays an optional import of this module.
        self._request_cls: type[httpx.Request] = httpx.Request
        self._client_cls: type[httpx.AsyncClient] = httpx.AsyncClient
        self._http_error: type[httpx.HTTPError] = httpx.HTTPError
        self._timeout_error: type[httpx.TimeoutException] = httpx.TimeoutException
        self.settings = settings
        upstream = httpx.URL(settings.upstream)
        self._origin = upstream.copy_with(raw_path=b"/")
        self._base_path = upstream.raw_path.rstrip(b"/")
        self._timeout = httpx.Timeout(
            settings.upstream_timeout,
            connect=settings.connect_timeout,
            pool=settings.connect_timeout,
        )
        self._limits = httpx.Limits(
            max_connections=settings.max_connections,
            max_keepalive_connections=settings.max_connections,
            keepalive_expiry=_KEEPALIVE_EXPIRY,
        )
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def client(self) -> httpx.AsyncClient:
        """The pooled client of the running event loop (one per worker process)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = self._client_cls(
                timeout=self._timeout, limits=self._limits, follow_redirects=False
            )
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the pooled connections."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # websockets are not proxied; uvicorn answers 403 to an unaccepted one
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        first: bytes = message.get("body", b"")
        content: bytes | AsyncIterator[bytes] = first
        if message.get("more_body", False):
            content = _stream_body(first, receive)
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
        query: bytes = scope.get("query_string", b"")
        request = self._request_cls(
            scope["method"],
            self._origin.copy_with(
                raw_path=self._base_path + raw_path + (b"?" + query if query else b"")
            ),
            headers=self._request_headers(scope),
            content=content,
        )
        protected = scope.get(CONTEXT_SCOPE_KEY) is not None
        mark = protected and self.settings.on_ambiguous == "unknown"
        sent = False

        async def trace(event: str, info: Mapping[str, Any]) -> None:
            # httpx's documented "trace" request extension; the event names are httpcore's
            # (tests/proxy kill upstreams and proxies to catch a rename).
            nonlocal sent
            if event.endswith(".send_request_headers.started"):
                # The last moment before the upstream may see the request: mark first, so that
                # not even a SIGKILL of this process can lead to a second forward.
                if mark and not await mark_committed(scope):
                    raise _MarkFailed
                sent = True

        request.extensions["trace"] = trace
        try:
            response = await self.client().send(request, stream=True)
        except _MarkFailed:
            outcome_known(scope)  # nothing was sent: release the key
            await _problem(
                send,
                "idempotency-store-unavailable",
                "The idempotency store cannot be reached; the request was not forwarded.",
                retry_after=1,
            )
            return
        except _ClientGone:
            return
        except self._http_error as exc:
            await self._failed(send, exc, sent=sent, protected=protected)
            return
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": _strip_hop_by_hop(response.headers.raw),
                }
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except self._http_error as exc:
            # The status line has left: the client sees a cut-off response (uvicorn closes the
            # connection) and the key stays marked, so a retry is told the outcome is unknown.
            logger.warning(
                "upstream answer to %s %s broke off: %r", scope["method"], scope["path"], exc
            )
            return
        except OSError:
            return  # the client went away (unprotected request: nothing to capture)
        finally:
            await response.aclose()
        outcome_known(scope)  # a full answer: its status decides, not the mark
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _request_headers(self, scope: Scope) -> list[tuple[bytes, bytes]]:
        raw_headers: list[tuple[bytes, bytes]] = scope["headers"]
        trust = self.settings.trust_forwarded
        dropped = _connection_tokens(raw_headers)
        headers: list[tuple[bytes, bytes]] = []
        host = b""
        prior: dict[bytes, list[bytes]] = {}
        for name, value in raw_headers:
            if name in HOP_BY_HOP or name in dropped:
                continue
            if name == b"host":
                host = value  # the upstream gets its own Host; the original goes in Forwarded
                continue
            if name in _FORWARDING:
                if trust:
                    prior.setdefault(name, []).append(value)
                    if name == b"x-real-ip":
                        headers.append((name, value))
                continue
            headers.append((name, value))
        proto = str(scope.get("scheme", "http")).encode("latin-1")
        client = scope.get("client")
        node = str(client[0]) if client else "unknown"
        quoted = f'"[{node}]"' if ":" in node else node
        element = b"for=" + quoted.encode("latin-1") + b";proto=" + proto
        if host:
            element += b';host="' + host.replace(b'"', b"") + b'"'
        headers.append((b"forwarded", b", ".join([*prior.get(b"forwarded", []), element])))
        chain = [*prior.get(b"x-forwarded-for", []), node.encode("latin-1")]
        headers.append((b"x-forwarded-for", b", ".join(chain)))
        headers.append((b"x-forwarded-proto", prior.get(b"x-forwarded-proto", [proto])[0]))
        if host or b"x-forwarded-host" in prior:
            headers.append((b"x-forwarded-host", prior.get(b"x-forwarded-host", [host])[0]))
        return headers

    async def _failed(self, send: Send, exc: Exception, *, sent: bool, protected: bool) -> None:
        """Answer a failed forward with problem+json: 504 for timeouts, else 502."""
        timeout = isinstance(exc, self._timeout_error)
        logger.warning("upstream %s failed: %r", "request" if sent else "connection", exc)
        if not sent:
            # Nothing reached the upstream: the middleware releases the key (5xx), so the
            # same key may simply be retried.
            await _problem(
                send,
                "upstream-timeout" if timeout else "upstream-unreachable",
                f"The upstream could not be reached ({type(exc).__name__}); nothing was sent. "
                "Retry with the same Idempotency-Key.",
            )
            return
        detail = (
            f"The request was sent to the upstream but no answer came back "
            f"({type(exc).__name__}): it may have taken effect."
        )
        if protected and self.settings.on_ambiguous == "unknown":
            detail += (
                " It is never forwarded twice: retries with this Idempotency-Key get 409 "
                "idempotency-outcome-unknown until an operator resolves the key."
            )
        await _problem(send, "upstream-timeout" if timeout else "upstream-no-answer", detail)


async def _stream_body(first: bytes, receive: Receive) -> AsyncIterator[bytes]:
    """The client's request body, chunk by chunk, as it arrives (never buffered whole)."""
    if first:
        yield first
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


def _connection_tokens(headers: list[tuple[bytes, bytes]]) -> set[bytes]:
    tokens: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            tokens.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return tokens


def _strip_hop_by_hop(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    dropped = _connection_tokens(headers)
    kept = []
    for name, value in headers:
        lname = name.lower()
        if lname not in HOP_BY_HOP and lname not in dropped:
            kept.append((lname, value))
    return kept


async def _problem(send: Send, slug: str, detail: str, *, retry_after: int | None = None) -> None:
    status, headers, body = render_problem(
        slug, detail, type_base="urn:retrysafe:problem:", retry_after=retry_after
    )
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
