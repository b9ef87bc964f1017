"""The proxy's upstream client against real sockets: keep-alive reuse, framing (length, chunked,
close-delimited, cut off), the pool's limit and wait, and connections the upstream closed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from retrysafe.proxy._upstream import Pool, UpstreamError

Answer = Callable[[bytes], Awaitable[tuple[bytes, bool]]]
Factory = Callable[[Answer], Awaitable["Upstream"]]


class Upstream:
    """A loopback server that answers each request head with scripted bytes."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> Upstream:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests.append(head)
                data, close = await self.answer(head)
                writer.write(data)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


@pytest.fixture
async def upstream_factory() -> AsyncIterator[Callable[[Answer], Awaitable[Upstream]]]:
    started: list[Upstream] = []

    async def make(answer: Answer) -> Upstream:
        server = await Upstream(answer).start()
        started.append(server)
        return server

    yield make
    for server in started:
        await server.stop()


def pool_for(upstream: Upstream, **options: float) -> Pool:
    settings: dict[str, float] = {
        "max_connections": 4,
        "connect_timeout": 2.0,
        "timeout": 2.0,
        "keepalive_expiry": 2.0,
    }
    settings.update(options)
    return Pool(
        "127.0.0.1",
        upstream.port,
        tls=None,
        max_connections=int(settings["max_connections"]),
        connect_timeout=settings["connect_timeout"],
        timeout=settings["timeout"],
        keepalive_expiry=settings["keepalive_expiry"],
    )


async def exchange(pool: Pool, head: bool = False) -> tuple[int, bytes]:
    conn = await pool.acquire()
    conn.start(head_request=head)
    method = b"HEAD" if head else b"GET"
    conn.send(method + b" /x HTTP/1.1\r\nhost: u\r\n\r\n")
    try:
        status, _ = await conn.response_head()
        body = b"".join([chunk async for chunk in conn.response_body()])
    except UpstreamError:
        conn.close()
        pool.release(conn)
        raise
    pool.release(conn)
    return status, body


def fixed(data: bytes, close: bool = False) -> Answer:
    async def answer(head: bytes) -> tuple[bytes, bool]:
        return data, close

    return answer


OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


async def test_a_connection_is_reused_after_a_clean_exchange(upstream_factory: Factory) -> None:
    upstream = await upstream_factory(fixed(OK))
    pool = pool_for(upstream)
    for _ in range(5):
        assert await exchange(pool) == (200, b"ok")
    assert upstream.connections == 1
    await pool.aclose()


async def test_chunked_and_close_delimited_bodies_arrive_whole(upstream_factory: Factory) -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    )
    upstream = await upstream_factory(fixed(chunked))
    pool = pool_for(upstream)
    assert await exchange(pool) == (200, b"abcde")
    assert await exchange(pool) == (200, b"abcde")
    assert upstream.connections == 1
    until_close = await upstream_factory(fixed(b"HTTP/1.1 200 OK\r\n\r\nall of it", close=True))
    pool = pool_for(until_close)
    assert await exchange(pool) == (200, b"all of it")
    assert await exchange(pool) == (200, b"all of it")
    assert until_close.connections == 2  # the end of the body was the end of the connection


async def test_an_answer_cut_short_is_an_error_never_a_shorter_body(
    upstream_factory: Factory,
) -> None:
    upstream = await upstream_factory(
        fixed(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf", close=True)
    )
    pool = pool_for(upstream)
    with pytest.raises(UpstreamError, match="closed the connection mid-answer"):
        await exchange(pool)


async def test_connection_close_and_head_answers_are_not_reused(upstream_factory: Factory) -> None:
    upstream = await upstream_factory(
        fixed(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok", close=True)
    )
    pool = pool_for(upstream)
    for _ in range(2):
        assert await exchange(pool) == (200, b"ok")
    assert upstream.connections == 2
    head_answer = await upstream_factory(fixed(b"HTTP/1.1 200 OK\r\ncontent-length: 99\r\n\r\n"))
    pool = pool_for(head_answer)
    assert await exchange(pool, head=True) == (200, b"")  # no wait for 99 bytes
    assert await exchange(pool, head=True) == (200, b"")


async def test_an_interim_answer_is_skipped(upstream_factory: Factory) -> None:
    upstream = await upstream_factory(fixed(b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n" + OK))
    pool = pool_for(upstream)
    assert await exchange(pool) == (200, b"ok")


async def test_idle_connections_expire_and_closed_ones_are_not_used(
    upstream_factory: Factory,
) -> None:
    upstream = await upstream_factory(fixed(OK))
    pool = pool_for(upstream, keepalive_expiry=0.2)
    await exchange(pool)
    await asyncio.sleep(0.3)
    await exchange(pool)
    assert upstream.connections == 2  # the idle one had expired
    # The upstream closes an idle connection: the next request opens another.
    closing = await upstream_factory(fixed(OK, close=True))
    pool = pool_for(closing)
    conn = await pool.acquire()
    conn.start(head_request=False)
    conn.send(b"GET / HTTP/1.1\r\nhost: u\r\n\r\n")
    await conn.response_head()
    async for _ in conn.response_body():
        pass
    pool.release(conn)  # kept: the answer said keep-alive
    await asyncio.sleep(0.1)  # ...but the server closes it now
    assert await exchange(pool) == (200, b"ok")
    assert closing.connections == 2


async def test_requests_beyond_the_limit_wait_for_a_connection_then_time_out(
    upstream_factory: Factory,
) -> None:
    gate = asyncio.Event()

    async def slow(head: bytes) -> tuple[bytes, bool]:
        await gate.wait()
        return OK, False

    upstream = await upstream_factory(slow)
    pool = pool_for(upstream, max_connections=1, connect_timeout=0.3)
    first = asyncio.ensure_future(exchange(pool))
    await asyncio.sleep(0.05)
    with pytest.raises(UpstreamError, match="no upstream connection became free") as waited:
        await pool.acquire()
    assert waited.value.timeout
    second = asyncio.ensure_future(exchange(pool))
    await asyncio.sleep(0.05)
    gate.set()
    assert await first == (200, b"ok")
    assert await second == (200, b"ok")  # handed the first one's connection
    assert upstream.connections == 1


async def test_a_refused_connection_is_an_error_and_frees_its_slot() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    pool = Pool(
        "127.0.0.1",
        port,
        tls=None,
        max_connections=1,
        connect_timeout=1.0,
        timeout=1.0,
        keepalive_expiry=1.0,
    )
    for _ in range(3):  # the slot comes back each time: never a pool timeout
        with pytest.raises(UpstreamError, match="cannot connect") as refused:
            await pool.acquire()
        assert not refused.value.timeout
