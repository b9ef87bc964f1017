"""Forwarding: the upstream client, streaming both ways, the commit mark before the first byte."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from .._core.errors import ConfigurationError
from .._core.problems import render_problem
from .._core.transaction import CONTEXT_SCOPE_KEY, mark_committed, outcome_known
from ._commit import READY
from .settings import ProxySettings

if TYPE_CHECKING:
    from ._upstream import Connection, Pool, UpstreamError

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


#: Methods whose empty body is sent without ``Content-Length`` (RFC 9110 section 8.6).
_NO_BODY_METHODS = frozenset({b"GET", b"HEAD", b"DELETE", b"OPTIONS", b"TRACE", b"CONNECT"})


class _ClientGone(Exception):
    """The client went away while its request body streamed."""


class UpstreamProxy:
    """ASGI app that forwards every HTTP request to the upstream and streams the answer back.

    Args:
        settings: the proxy settings.

    Raises:
        ConfigurationError: httptools is not installed.
    """

    def __init__(self, settings: ProxySettings) -> None:
        try:
            from ._upstream import Pool, UpstreamError
        except ImportError as exc:  # pragma: no cover - the extra is installed in tests
            raise ConfigurationError(
                f"retrysafe proxy needs: pip install 'retrysafe[proxy]' ({exc})"
            ) from exc
        self._pool_cls = Pool
        self._error: type[UpstreamError] = UpstreamError
        self.settings = settings
        parts = urlsplit(settings.upstream)
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._tls = parts.scheme == "https"
        self._host_header = parts.netloc.rpartition("@")[2].encode("ascii")
        self._base_path = quote(parts.path, safe="/:@!$&'()*+,;=%~").rstrip("/").encode("ascii")
        self._pool: Pool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def pool(self) -> Pool:
        """The connection pool of the running event loop (one per worker process)."""
        loop = asyncio.get_running_loop()
        if self._pool is None or self._loop is not loop:
            settings = self.settings
            self._pool = self._pool_cls(
                self._host,
                self._port,
                tls=ssl.create_default_context() if self._tls else None,
                max_connections=settings.max_connections,
                connect_timeout=settings.connect_timeout,
                timeout=settings.upstream_timeout,
                keepalive_expiry=_KEEPALIVE_EXPIRY,
            )
            self._loop = loop
        return self._pool

    async def aclose(self) -> None:
        """Close the pooled connections."""
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # websockets are not proxied; uvicorn answers 403 to an unaccepted one
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body: bytes = message.get("body", b"")
        streamed = message.get("more_body", False)
        head, chunked = self._request_head(scope, body, streamed)
        protected = scope.get(CONTEXT_SCOPE_KEY) is not None
        pool = self.pool()
        ready = READY.get()
        if ready is not None and ready.conn is not None:
            conn, ready.conn = ready.conn, None  # taken before the reservation (see _commit)
        else:
            try:
                conn = await pool.acquire()
            except self._error as exc:
                await self._failed(send, exc, sent=False, protected=protected)
                return
        sent = False
        try:
            conn.start(head_request=scope["method"] == "HEAD")
            # The last moment before the upstream may see the request: mark first, so that not
            # even a SIGKILL of this process can lead to a second forward.
            mark = protected and self.settings.on_ambiguous == "unknown"
            if mark and not await mark_committed(scope):
                pool.release(conn)  # unused: still clean
                outcome_known(scope)  # nothing was sent: release the key
                await _problem(
                    send,
                    "idempotency-store-unavailable",
                    "The idempotency store cannot be reached; the request was not forwarded.",
                    retry_after=1,
                )
                return
            # send() raises before writing anything on a connection already lost.
            conn.send(head + body if not streamed else head)
            sent = True
            if streamed:
                await _stream_body(conn, body, receive, chunked=chunked)
            status, headers = await conn.response_head()
        except _ClientGone:
            conn.close()
            pool.release(conn)
            return
        except self._error as exc:
            conn.close()
            pool.release(conn)
            if not sent:
                outcome_known(scope)  # marked, but nothing left: the 502 releases the key
            await self._failed(send, exc, sent=sent, protected=protected)
            return
        except BaseException:
            conn.close()
            pool.release(conn)
            raise
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": _strip_hop_by_hop(headers) if conn.hop_by_hop else headers,
                }
            )
            if not conn.complete:
                async for chunk in conn.response_body():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            rest = conn.take_body()
        except self._error as exc:
            # The status line has left: the client sees a cut-off response (uvicorn closes the
            # connection) and the key stays marked, so a retry is told the outcome is unknown.
            conn.close()
            pool.release(conn)
            logger.warning(
                "upstream answer to %s %s broke off: %r", scope["method"], scope["path"], exc
            )
            return
        except OSError:
            conn.close()
            pool.release(conn)
            return  # the client went away (unprotected request: nothing to capture)
        except BaseException:
            conn.close()
            pool.release(conn)
            raise
        pool.release(conn)
        outcome_known(scope)  # a full answer: its status decides, not the mark
        await send({"type": "http.response.body", "body": rest, "more_body": False})

    def _request_head(self, scope: Scope, body: bytes, streamed: bool) -> tuple[bytes, bool]:
        """The request line and header fields for the upstream, ending with the blank line, and
        whether the body goes chunked. One pass over the client's header fields: hop-by-hop
        ones (and those ``Connection`` names) dropped, ``Host`` replaced by the upstream's,
        ``Content-Length`` set from the body, the forwarding fields added."""
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
        query: bytes = scope.get("query_string", b"")
        method: bytes = scope["method"].encode("ascii")
        parts = [method, b" ", self._base_path, raw_path]
        if query:
            parts += [b"?", query]
        parts += [b" HTTP/1.1\r\nhost: ", self._host_header]
        raw_headers: list[tuple[bytes, bytes]] = scope["headers"]
        dropped = _connection_tokens(raw_headers)
        trust = self.settings.trust_forwarded
        length = host = b""
        prior: dict[bytes, list[bytes]] = {}
        for name, value in raw_headers:
            if name in HOP_BY_HOP or (dropped and name in dropped):
                continue
            if name == b"content-length":
                length = value
            elif name == b"host":
                host = value  # the upstream gets its own Host; the original goes in Forwarded
            elif name in _FORWARDING:
                if trust:
                    prior.setdefault(name, []).append(value)
                    if name == b"x-real-ip":
                        parts += [b"\r\n", name, b": ", value]
            else:
                parts += [b"\r\n", name, b": ", value]
        proto = str(scope.get("scheme", "http")).encode("latin-1")
        client = scope.get("client")
        node = (str(client[0]) if client else "unknown").encode("latin-1")
        quoted = b'"[' + node + b']"' if b":" in node else node
        element = b"for=" + quoted + b";proto=" + proto
        if host:
            element += b';host="' + host.replace(b'"', b"") + b'"'
        if prior:
            element = b", ".join([*prior.get(b"forwarded", []), element])
            node = b", ".join([*prior.get(b"x-forwarded-for", []), node])
            proto = prior.get(b"x-forwarded-proto", [proto])[0]
            host = prior.get(b"x-forwarded-host", [host])[0]
        parts += [b"\r\nforwarded: ", element, b"\r\nx-forwarded-for: ", node]
        parts += [b"\r\nx-forwarded-proto: ", proto]
        if host:
            parts += [b"\r\nx-forwarded-host: ", host]
        chunked = False
        if streamed:
            # The client's own length when it gave one, else chunked (as it arrived).
            chunked = not length
            parts.append(
                b"\r\ntransfer-encoding: chunked" if chunked else b"\r\ncontent-length: " + length
            )
        elif body or length or method not in _NO_BODY_METHODS:
            parts.append(b"\r\ncontent-length: " + str(len(body)).encode("ascii"))
        parts.append(b"\r\n\r\n")
        return b"".join(parts), chunked

    async def _failed(self, send: Send, exc: UpstreamError, *, sent: bool, protected: bool) -> None:
        """Answer a failed forward with problem+json: 504 for timeouts, else 502."""
        timeout = exc.timeout
        logger.warning("upstream %s failed: %r", "request" if sent else "connection", exc)
        if not sent:
            # Nothing reached the upstream: the middleware releases the key (5xx), so the
            # same key may simply be retried.
            await _problem(
                send,
                "upstream-timeout" if timeout else "upstream-unreachable",
                f"The upstream could not be reached ({exc}); nothing was sent. "
                "Retry with the same Idempotency-Key.",
            )
            return
        detail = (
            f"The request was sent to the upstream but no answer came back "
            f"({exc}): it may have taken effect."
        )
        if protected and self.settings.on_ambiguous == "unknown":
            detail += (
                " It is never forwarded twice: retries with this Idempotency-Key get 409 "
                "idempotency-outcome-unknown until an operator resolves the key."
            )
        await _problem(send, "upstream-timeout" if timeout else "upstream-no-answer", detail)


async def _stream_body(conn: Connection, first: bytes, receive: Receive, *, chunked: bool) -> None:
    """Send the client's request body as it arrives (never buffered whole), with flow control.

    Stops early when the upstream has answered already (it will not read the rest: the
    connection is then not reused).
    """
    chunk = first
    while True:
        if chunk:
            conn.send(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
            await conn.drain()
        if conn.answered:
            conn.close_after()
            return
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk = message.get("body", b"")
        if not message.get("more_body", False):
            break
    if chunked:
        conn.send(b"%x\r\n%b\r\n0\r\n\r\n" % (len(chunk), chunk) if chunk else b"0\r\n\r\n")
    elif chunk:
        conn.send(chunk)


def _connection_tokens(headers: list[tuple[bytes, bytes]]) -> set[bytes]:
    # Header names are lower-case on both sides (ASGI's, and the upstream client's).
    tokens: set[bytes] = set()
    for name, value in headers:
        if name == b"connection":
            tokens.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return tokens


def _strip_hop_by_hop(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    dropped = _connection_tokens(headers)
    return [(n, v) for n, v in headers if n not in HOP_BY_HOP and n not in dropped]


async def _problem(send: Send, slug: str, detail: str, *, retry_after: int | None = None) -> None:
    status, headers, body = render_problem(
        slug, detail, type_base="urn:retrysafe:problem:", retry_after=retry_after
    )
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
