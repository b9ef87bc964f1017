"""A fault-injecting HTTP/1.1 proxy on loopback, between a client under test and a real server.

Each request (read whole: head + ``Content-Length`` body) is forwarded on a fresh upstream
connection unless its fault says otherwise. Faults are planned per Idempotency-Key: the n-th
distinct key seen gets ``plan(n)``, a list of faults for its first attempts; later attempts pass.

- ``"reset"``: the connection is reset before anything is forwarded (the server never sees it);
- ``"503"``: answered ``503`` + ``Retry-After: 1`` by the proxy (never forwarded);
- ``"drop"``: forwarded and answered by the server, then the connection is closed without a
  byte of the answer (the lost response: the order exists, the client does not know);
- ``"drop_rst"``: the same, closed with a reset;
- ``"truncate"``: forwarded and answered, but only the head and half the body are sent back;
- ``"delay"``: forwarded and answered, but the answer is held ``hold`` seconds (past the
  client's read timeout).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections import Counter
from collections.abc import Callable

__all__ = ["FORWARDING_FAULTS", "FaultProxy"]

FORWARDING_FAULTS = frozenset({"drop", "drop_rst", "delay", "truncate"})
_503 = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n"


def _headers(head: bytes) -> dict[str, str]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    out: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if sep:
            out[name.strip().lower()] = value.strip()
    return out


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        # SO_LINGER 0: close() sends RST instead of FIN.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    """The proxy, served from its own event-loop thread.

    Args:
        upstream_port: the real server's port on 127.0.0.1.
        plan: faults for the n-th distinct key (0-based).
        hold: seconds a ``"delay"`` answer is held.

    Attributes:
        seen: requests received per key (every attempt).
        forwarded: requests that reached the server per key.
        faults: how many of each fault were injected.
        schedule: the plan each key got.
    """

    def __init__(
        self, upstream_port: int, plan: Callable[[int], list[str]], *, hold: float = 3.5
    ) -> None:
        self.upstream_port = upstream_port
        self.plan = plan
        self.hold = hold
        self.seen: Counter[str] = Counter()
        self.forwarded: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.schedule: dict[str, list[str]] = {}
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._lock = threading.Lock()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._client, "127.0.0.1", 0), self._loop
        )
        self._server = future.result(timeout=10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for writer in list(self._writers):
                writer.close()
            # Let the transports finish closing their sockets before the loop stops.
            for _ in range(3):
                await asyncio.sleep(0.01)

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def _fault_for(self, key: str) -> str:
        with self._lock:
            if key not in self.schedule:
                self.schedule[key] = list(self.plan(len(self.schedule)))
            self.seen[key] += 1
            attempt = self.seen[key]
            faults = self.schedule[key]
            fault = faults[attempt - 1] if attempt <= len(faults) else "pass"
            if fault != "pass":
                self.faults[fault] += 1
            return fault

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                headers = _headers(head)
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                fault = self._fault_for(headers.get("idempotency-key", ""))
                if fault == "reset":
                    _reset(writer)
                    return
                if fault == "503":
                    writer.write(_503)
                    await writer.drain()
                    continue
                answer = await self._forward(head + body)
                with self._lock:
                    self.forwarded[headers.get("idempotency-key", "")] += 1
                if fault == "drop":
                    return
                if fault == "drop_rst":
                    _reset(writer)
                    return
                if fault == "truncate":
                    head_end = answer.index(b"\r\n\r\n") + 4
                    writer.write(answer[: head_end + (len(answer) - head_end) // 2])
                    await writer.drain()
                    return
                if fault == "delay":
                    await asyncio.sleep(self.hold)
                writer.write(answer)
                await writer.drain()
                if fault == "delay" or headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()
            self._writers.discard(writer)

    async def _forward(self, request: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        try:
            writer.write(request)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            headers = _headers(head)
            if "content-length" in headers:
                body = await reader.readexactly(int(headers["content-length"]))
            else:
                raise RuntimeError(f"upstream answer without Content-Length: {head!r}")
            return head + body
        finally:
            writer.close()
