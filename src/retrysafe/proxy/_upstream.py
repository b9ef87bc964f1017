"""The proxy's upstream client: HTTP/1.1 on a pool of keep-alive asyncio connections.

Lean on purpose (a bare httpx forwarder did 145 req/s at 32 connections in front of a backend
that alone did 12,581, and got slower as concurrency grew; see docs/design.md): one
:class:`asyncio.Protocol` per connection, responses parsed by ``httptools`` (llhttp, the parser
uvicorn uses), no per-request objects beyond the head it writes. It does only what forwarding
needs, and lets the caller act *between* taking a connection and writing the first byte, which
is where the proxy marks a keyed request committed:

    conn = await pool.acquire()          # UpstreamError here: nothing was sent
    ...mark...
    conn.send(head)                      # from here on the upstream may have seen the request
    await conn.send_body(...)            # streamed, with flow control
    status, headers = await conn.response_head()
    async for chunk in conn.response_body(): ...
    pool.release(conn)                   # kept for the next request only after a full exchange

Framing follows RFC 9112: a response ends at its ``Content-Length``, its last chunk, or (with
neither) the upstream closing the connection; answers to ``HEAD`` and ``1xx``/``204``/``304``
have no body. A connection whose exchange did not end cleanly is closed, never reused.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import KW_ONLY, dataclass
from typing import Any

import httptools

from .forward import HOP_BY_HOP

__all__ = ["Connection", "Pool", "UpstreamError"]

#: Pause reading from the upstream while this much of its answer waits for the client.
_HIGH_WATER = 256 * 1024


class UpstreamError(Exception):
    """An upstream exchange failed.

    Args:
        message: what happened.
        timeout: it was a timeout (504) rather than a refusal or a broken connection (502).
    """

    def __init__(self, message: str, *, timeout: bool = False) -> None:
        super().__init__(message)
        self.timeout = timeout


class Connection(asyncio.Protocol):
    """One keep-alive connection to the upstream and the exchange on it (one at a time)."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False  # the upstream closed (or the socket broke)
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._write_paused = False
        self._error: UpstreamError | None = None
        # The current response.
        self._head_request = False
        self._status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_done = False
        self._framed = False  # Content-Length or chunked: EOF before the end is a cut-off
        self._body: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._complete = False
        self._read_paused = False
        self._sent = False  # a byte of the current request was written
        self._reuse = True
        self._keep_alive = False
        #: The answer has a hop-by-hop header field (``Connection``, ``Keep-Alive``...).
        self.hop_by_hop = False

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports have the asyncio.Transport methods without deriving from it.
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._fail(UpstreamError(f"the upstream sent an invalid response ({exc})"))
            self._abort()
            return
        if self._buffered > _HIGH_WATER and not self._read_paused and self.transport:
            self._read_paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._closed()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed()
        if self._write_paused:
            self._write_paused = False
        self._wake()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake()

    # -- httptools callbacks ------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in HOP_BY_HOP:
            self.hop_by_hop = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            self._headers = []  # an interim answer (103 Early Hints): the real one follows
            return
        self._status = status
        self._head_done = True
        # Asked now: llhttp forgets the answer once the message is complete.
        self._keep_alive = self.parser.should_keep_alive()
        if self._head_request:
            self._complete = True  # no body, whatever Content-Length says (RFC 9110 9.3.2)
            return
        for name, value in self._headers:
            if name == b"content-length" or (
                name == b"transfer-encoding" and b"chunked" in value.lower()
            ):
                self._framed = True

    def on_body(self, body: bytes) -> None:
        if self._complete:
            return  # a HEAD answer's body: not ours
        self._body.append(body)
        self._buffered += len(body)

    def on_message_complete(self) -> None:
        if self._head_done:
            self._complete = True

    # -- the exchange -------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Write without waiting (the head, a small body)."""
        if self.lost or self.transport is None:
            raise self._error or UpstreamError("the upstream closed the connection")
        self._sent = True
        self.transport.write(data)

    async def drain(self) -> None:
        """Wait until the upstream takes what was written (flow control)."""
        while self._write_paused and not self.lost:
            await self._wait(self.pool.timeout, "writing to the upstream timed out")
        if self.lost and not self._head_done:
            raise self._error or UpstreamError("the upstream closed the connection")

    async def response_head(self) -> tuple[int, list[tuple[bytes, bytes]]]:
        """Wait for the status line and header fields of the answer."""
        while not self._head_done:
            if self.lost:
                raise self._error or UpstreamError("the upstream closed the connection")
            await self._wait(self.pool.timeout, "the upstream did not answer in time")
        return self._status, self._headers

    def take_body(self) -> bytes:
        """What of the body has arrived so far (resumes reading when it was paused)."""
        if not self._body:
            return b""
        data = self._body.popleft() if len(self._body) == 1 else b"".join(self._body)
        self._body.clear()
        self._buffered = 0
        if self._read_paused and self.transport is not None:
            self._read_paused = False
            self.transport.resume_reading()
        return data

    @property
    def answered(self) -> bool:
        """The status line and header fields of the answer have arrived."""
        return self._head_done

    def close_after(self) -> None:
        """Do not reuse the connection after this exchange (the request was cut short)."""
        self._reuse = False

    @property
    def complete(self) -> bool:
        """The whole answer has arrived (what :meth:`take_body` has not given yet aside)."""
        return self._complete

    async def response_body(self) -> AsyncIterator[bytes]:
        """The rest of the answer's body, chunk by chunk as it arrives."""
        while True:
            data = self.take_body()
            if data:
                yield data
            if self._complete:
                return
            if self.lost:
                if not self._framed and self._error is None:
                    self._complete = True  # delimited by the close (RFC 9112 section 6.3)
                    return
                raise self._error or UpstreamError("the upstream closed the connection mid-answer")
            await self._wait(self.pool.timeout, "the upstream stopped sending its answer")

    def start(self, head_request: bool) -> None:
        """Reset the per-response state before a request is written."""
        self._head_request = head_request
        self._status = 0
        self._headers = []
        self._head_done = False
        self._framed = False
        self._complete = False
        self._body.clear()
        self._buffered = 0
        self._sent = False
        self._reuse = True
        self._keep_alive = False
        self.hop_by_hop = False

    @property
    def reusable(self) -> bool:
        """Whether the connection may serve another request: unused by this one, or its
        exchange ended cleanly and the upstream keeps the connection open."""
        if self.lost or self._error is not None or not self._reuse:
            return False
        if not self._sent:
            return True
        return self._complete and not self._head_request and self._keep_alive

    def close(self) -> None:
        """Close the connection (its exchange, if any, is abandoned)."""
        self._abort()

    # -- internals ----------------------------------------------------------------------------

    def _closed(self) -> None:
        self.lost = True

    def _abort(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None:
            self._error = error

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self, seconds: float, message: str) -> None:
        waiter = self._waiter = self.loop.create_future()
        timer = self.loop.call_later(seconds, _expire, waiter, message)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None


def _expire(waiter: asyncio.Future[None], message: str) -> None:
    if not waiter.done():
        waiter.set_exception(UpstreamError(message, timeout=True))


@dataclass(eq=False, repr=False)
class Pool:
    """Keep-alive connections to one upstream origin, at most ``max_connections`` at once.

    Args:
        host: the upstream host.
        port: its port.
        tls: an :class:`ssl.SSLContext` for ``https://`` upstreams, else ``None``.
        max_connections: connections open at once; a request beyond waits for one.
        connect_timeout: seconds to connect, and to wait for a free connection.
        timeout: seconds each read or write of the upstream may take.
        keepalive_expiry: an idle connection older than this is closed rather than reused.
    """

    host: str
    port: int
    _: KW_ONLY
    tls: ssl.SSLContext | None
    max_connections: int
    connect_timeout: float
    timeout: float
    keepalive_expiry: float

    def __post_init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._idle: list[Connection] = []  # most recently used last
        self._open = 0
        self._waiting: collections.deque[asyncio.Future[Connection | None]] = collections.deque()
        self._closed = False

    async def acquire(self) -> Connection:
        """A connection ready for one exchange: an idle one, a new one, or the next one freed.

        Raises:
            UpstreamError: no connection within ``connect_timeout`` (nothing was sent).
        """
        conn = self.take_idle()
        if conn is not None:
            return conn
        if self._open < self.max_connections:
            return await self._connect()
        waiter: asyncio.Future[Connection | None] = self.loop.create_future()
        self._waiting.append(waiter)
        timer = self.loop.call_later(self.connect_timeout, _no_connection, waiter)
        try:
            handed = await waiter
        except asyncio.CancelledError:
            # Cancelled just after being handed a connection or a slot: pass it on.
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                given = waiter.result()
                if given is None:
                    self._slot_freed()
                else:
                    self.release(given)
            raise
        finally:
            timer.cancel()
        if handed is None:  # a slot was freed, not a connection
            return await self._connect()
        return handed

    def take_idle(self) -> Connection | None:
        """An idle connection still fresh enough to reuse, or ``None`` (never waits)."""
        now = time.monotonic()
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.lost and now - conn.idle_since < self.keepalive_expiry:
                return conn
            self._discard(conn)
        return None

    def release(self, conn: Connection) -> None:
        """Give a connection back after its exchange: kept when reusable, else closed."""
        if not conn.reusable or self._closed:
            self._discard(conn)
            return
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    async def aclose(self) -> None:
        """Close every idle connection; connections in use close when released."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            self._discard(conn)

    async def _connect(self) -> Connection:
        self._open += 1
        try:
            _, protocol = await asyncio.wait_for(
                self.loop.create_connection(
                    lambda: Connection(self),
                    self.host,
                    self.port,
                    ssl=self.tls,
                    server_hostname=self.host if self.tls else None,
                ),
                self.connect_timeout,
            )
        except TimeoutError:
            self._slot_freed()
            raise UpstreamError("connecting to the upstream timed out", timeout=True) from None
        except OSError as exc:
            self._slot_freed()
            raise UpstreamError(f"cannot connect to the upstream ({exc})") from None
        except BaseException:
            self._slot_freed()
            raise
        return protocol

    def _discard(self, conn: Connection) -> None:
        conn.close()
        self._slot_freed()

    def _slot_freed(self) -> None:
        self._open -= 1
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


def _no_connection(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(
            UpstreamError("no upstream connection became free in time", timeout=True)
        )
