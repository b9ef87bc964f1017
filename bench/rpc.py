"""What the gRPC interceptor costs per unary call over the bare call: a real ``grpc.server``
(and ``grpc.aio.server``) on loopback, one caller, the bare server (no interceptor) beside the
interceptor on each local store, first calls (a new key each) and replays (one stored key)::

    python bench/rpc.py
    python bench/rpc.py --json out.json --calls 500 --repeat 3

Each figure is the best of ``--repeat`` rounds of ``--calls`` calls, in CPU microseconds per
call of the one process that holds client and server (what a call costs, store work included;
steadier than wall-clock time on a shared machine); the method returns its request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from retrysafe.contrib.grpc import AsyncIdempotencyInterceptor, IdempotencyInterceptor

METHOD = "/bench.Echo/Call"


def _sync_server(interceptor: Any) -> tuple[Any, int]:
    def echo(request: bytes, context: Any) -> bytes:
        return request

    server = grpc.server(
        futures.ThreadPoolExecutor(4), interceptors=[interceptor] if interceptor else []
    )
    handler = grpc.unary_unary_rpc_method_handler(echo)
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("bench.Echo", {"Call": handler})]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


class _AioServer:
    """A grpc.aio server on an event loop in a thread."""

    def __init__(self, store: str | None) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port: int = asyncio.run_coroutine_threadsafe(self._start(store), self.loop).result()

    async def _start(self, store: str | None) -> int:
        async def echo(request: bytes, context: Any) -> bytes:
            return request

        self.interceptor = AsyncIdempotencyInterceptor(store=store) if store else None
        interceptors = [self.interceptor] if self.interceptor else []
        self.server = grpc.aio.server(interceptors=interceptors)
        handler = grpc.unary_unary_rpc_method_handler(echo)
        self.server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler("bench.Echo", {"Call": handler})]
        )
        port: int = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return port

    async def _stop(self) -> None:
        await self.server.stop(None)
        if self.interceptor is not None:
            await self.interceptor.aclose()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:  # the lease keeper's sweeper
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


def _timed(send: Callable[[int], Any], calls: int) -> float:
    # CPU time of this process (the client, the server and gRPC's own threads): steadier than
    # wall-clock time on a machine other work shares.
    started = time.process_time()
    for i in range(calls):
        send(i)
    return time.process_time() - started


def _measure(bare_port: int, port: int, calls: int, repeat: int) -> dict[str, float]:
    """Rounds of bare, new-key and replay calls, interleaved (a loaded machine shifts them
    alike); the best round of each."""
    bare_channel = grpc.insecure_channel(f"127.0.0.1:{bare_port}")
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    bare, stub = bare_channel.unary_unary(METHOD), channel.unary_unary(METHOD)
    run = uuid.uuid4().hex
    payload = b'{"item": "tea", "quantity": 1}'
    replay = (("idempotency-key", f"{run}-replay"),)
    bare(payload)
    stub(payload, metadata=replay)  # connected, and the replayed key stored
    rounds: dict[str, list[float]] = {"bare": [], "new key": [], "replay": []}
    try:
        for r in range(repeat):
            rounds["bare"].append(_timed(lambda i: bare(payload), calls))
            new = _timed(
                lambda i, r=r: stub(payload, metadata=(("idempotency-key", f"{run}-{r}-{i}"),)),
                calls,
            )
            rounds["new key"].append(new)
            rounds["replay"].append(_timed(lambda i: stub(payload, metadata=replay), calls))
    finally:
        bare_channel.close()
        channel.close()
    found = {name: round(min(v) / calls * 1e6, 1) for name, v in rounds.items()}
    found["overhead"] = round(found["new key"] - found["bare"], 1)
    return found


def measure(calls: int, repeat: int) -> dict[str, dict[str, float]]:
    """Microseconds per call on each face and local store."""
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for face in ("sync", "aio"):
            for store in ("memory://", f"sqlite:///{Path(tmp) / face}.db"):
                label = f"{store.split(':')[0]} {face}"
                figures[label] = found = _run(face, store, calls, repeat)
                print(f"{label}: {found}", file=sys.stderr)
    return figures


def _run(face: str, store: str, calls: int, repeat: int) -> dict[str, float]:
    if face == "sync":
        interceptor = IdempotencyInterceptor(store=store)
        (bare, bare_port), (server, port) = _sync_server(None), _sync_server(interceptor)
        try:
            return _measure(bare_port, port, calls, repeat)
        finally:
            bare.stop(None)
            server.stop(None)
            interceptor.close()
    aio_bare, aio = _AioServer(None), _AioServer(store)
    try:
        return _measure(aio_bare.port, aio.port, calls, repeat)
    finally:
        aio_bare.stop()
        aio.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", help="write the figures here as JSON")
    args = parser.parse_args()
    figures = measure(args.calls, args.repeat)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
