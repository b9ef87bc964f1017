"""Real gRPC servers for the interceptor tests: a ``grpc.server`` (sync interceptor) or a
``grpc.aio.server`` on an event loop in a thread (async interceptor), on a free loopback port,
and a client that sends raw JSON bytes and keeps the raw response bytes."""

from __future__ import annotations

import asyncio
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from retrysafe.contrib.grpc import AsyncIdempotencyInterceptor, IdempotencyInterceptor

from .service import CREATE, UPLOAD, WATCH, Effects, dumps, handlers

__all__ = ["Outcome", "Server", "call"]

WAIT = 20.0


class Server:
    """One server with the interceptor over ``store`` (``kind``: ``sync`` or ``aio``)."""

    def __init__(self, kind: str, store: Any, effects: Path, **options: Any) -> None:
        self.kind = kind
        self.effects = Effects(effects)
        self.loop: asyncio.AbstractEventLoop | None = None
        if kind == "sync":
            self.interceptor: Any = IdempotencyInterceptor(store=store, **options)
            self.server: Any = grpc.server(
                futures.ThreadPoolExecutor(max_workers=16), interceptors=[self.interceptor]
            )
            self.server.add_generic_rpc_handlers((handlers(self.effects),))
            self.port = self.server.add_insecure_port("127.0.0.1:0")
            self.server.start()
        else:
            self.loop = asyncio.new_event_loop()
            self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
            self.thread.start()
            self.port = self._run(self._astart(store, options))
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")

    async def _astart(self, store: Any, options: dict[str, Any]) -> int:
        self.interceptor = AsyncIdempotencyInterceptor(store=store, **options)
        self.server = grpc.aio.server(interceptors=[self.interceptor])
        self.server.add_generic_rpc_handlers((handlers(self.effects, aio=True),))
        port: int = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return port

    def _run(self, coro: Any) -> Any:
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT)

    def close(self) -> None:
        self.channel.close()
        if self.loop is None:
            self.server.stop(None)
            self.interceptor.close()
            return
        self._run(self._aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT)
        self.loop.close()

    async def _aclose(self) -> None:
        await self.server.stop(None)
        await self.interceptor.aclose()


class Outcome:
    """What a unary call got: the status code, details, raw response bytes, trailing metadata."""

    def __init__(
        self, code: grpc.StatusCode, details: str, body: bytes | None, trailing: Any
    ) -> None:
        self.code = code
        self.details = details
        self.body = body
        self.trailing = dict(trailing or ())

    @property
    def replayed(self) -> bool:
        return self.trailing.get("idempotency-replayed") == "true"

    def __repr__(self) -> str:
        return f"<Outcome {self.code.name} {self.details!r} {self.body!r} {self.trailing}>"


def call(
    channel: grpc.Channel,
    request: dict[str, Any],
    *,
    key: str | None = None,
    method: str = CREATE,
    metadata: tuple[tuple[str, str], ...] = (),
    timeout: float = WAIT,
) -> Outcome:
    """One unary call of ``method`` with ``request`` (and ``idempotency-key: key``)."""
    stub = channel.unary_unary(method, request_serializer=dumps, response_deserializer=None)
    sent = metadata + ((("idempotency-key", key),) if key is not None else ())
    try:
        body, state = stub.with_call(request, metadata=sent, timeout=timeout)
    except grpc.RpcError as error:
        return Outcome(error.code(), error.details() or "", None, error.trailing_metadata())
    return Outcome(state.code(), state.details() or "", body, state.trailing_metadata())


def watch(channel: grpc.Channel, *, key: str | None = None) -> tuple[grpc.StatusCode, int]:
    """Call the streaming ``Watch``; its code and how many messages came."""
    stub = channel.unary_stream(WATCH, request_serializer=dumps, response_deserializer=None)
    sent = (("idempotency-key", key),) if key is not None else ()
    try:
        return grpc.StatusCode.OK, len(list(stub({}, metadata=sent, timeout=WAIT)))
    except grpc.RpcError as error:
        return error.code(), 0


def upload(channel: grpc.Channel, *, key: str | None = None) -> grpc.StatusCode:
    """Call the client-streaming ``Upload``; its code."""
    stub = channel.stream_unary(UPLOAD, request_serializer=dumps, response_deserializer=None)
    sent = (("idempotency-key", key),) if key is not None else ()
    try:
        stub(iter([{}, {}]), metadata=sent, timeout=WAIT)
    except grpc.RpcError as error:
        return error.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK
