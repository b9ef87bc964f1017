"""A small gRPC service for the interceptor tests, without protoc: generic method handlers
whose messages are JSON documents (``json.dumps``/``json.loads`` as the serializers), so the
tests need no generated code and no grpcio-tools, and the interceptor is exercised with real
(de)serializers: it must store and replay the exact bytes the servicer's serializer wrote.

Methods of ``shop.Orders``:

- ``Create`` (unary-unary): records one effect for ``request["item"]`` (an ``effects`` row in a
  SQLite file shared across processes, or the in-process list), then answers
  ``{"order": n, "item": ...}``. Knobs in the request: ``hold`` (seconds to sleep before the
  effect), ``entered`` (a file touched when the handler starts), ``hold_while`` (a file: the
  handler waits while it exists), ``abort`` (a status code name
  to end with, after the effect), ``fail`` (raise after nothing), ``tx`` (a table: write the
  effect there, on the idempotent transaction's connection), ``fail_after_write`` (raise
  after that write), ``fail_first_with`` (a code the item's first attempt ends with, before
  anything). Every attempt's key is appended to :data:`SEEN_KEYS`.
- ``Watch`` (unary-stream): streams two messages; ``Upload`` (stream-unary): counts messages.

``python -m tests.rpc.service PORT STORE_URL EFFECTS_DB [aio] [--lease S]`` serves it in a
process of its own (for the crash tests) until killed.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

import retrysafe
from retrysafe.functions import transaction

SERVICE = "shop.Orders"
CREATE = f"/{SERVICE}/Create"
WATCH = f"/{SERVICE}/Watch"
UPLOAD = f"/{SERVICE}/Upload"


def dumps(message: Any) -> bytes:
    return json.dumps(message, sort_keys=True).encode()


def loads(data: bytes) -> Any:
    return json.loads(data)


class Effects:
    """The service's effects: rows in a SQLite file (shared by processes), one per run."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY KEY, item TEXT)")
        self.lock = threading.Lock()

    def add(self, item: str) -> int:
        with self.lock, sqlite3.connect(self.path, timeout=30) as conn:
            cursor = conn.execute("INSERT INTO effects (item) VALUES (?)", (item,))
            return int(cursor.lastrowid or 0)

    def count(self, item: str | None = None) -> int:
        with sqlite3.connect(self.path, timeout=30) as conn:
            if item is None:
                return int(conn.execute("SELECT COUNT(*) FROM effects").fetchone()[0])
            query = "SELECT COUNT(*) FROM effects WHERE item = ?"
            return int(conn.execute(query, (item,)).fetchone()[0])


#: Items whose first attempt failed (``fail_first_with``), in this process.
_failed_once: set[str] = set()
#: The idempotency-key of every attempt that reached a handler, in order.
SEEN_KEYS: list[str] = []


def _fail_first(request: dict[str, Any]) -> str | None:
    """The code to end this attempt with: ``fail_first_with`` on the item's first attempt."""
    code = request.get("fail_first_with")
    if code and request["item"] not in _failed_once:
        _failed_once.add(request["item"])
        return str(code)
    return None


def _seen(context: Any) -> None:
    for name, value in context.invocation_metadata():
        if name == "idempotency-key":
            SEEN_KEYS.append(value)


def _start(request: dict[str, Any]) -> None:
    if request.get("entered"):
        Path(request["entered"]).touch()
    if request.get("hold_while"):  # wait (bounded) while the test keeps this file
        deadline = time.monotonic() + 30
        while Path(request["hold_while"]).exists() and time.monotonic() < deadline:
            time.sleep(0.02)


def _create_sync(effects: Effects) -> Any:
    def create(request: dict[str, Any], context: grpc.ServicerContext) -> dict[str, Any]:
        _seen(context)
        _start(request)
        if (code := _fail_first(request)) is not None:
            context.abort(grpc.StatusCode[code], "failed first")
        time.sleep(request.get("hold", 0))
        if request.get("fail"):
            raise RuntimeError("the handler failed")
        if request.get("tx"):
            conn = transaction()
            mark = "%s" if type(conn).__module__.startswith("psycopg") else "?"
            conn.execute(f"INSERT INTO {request['tx']} (item) VALUES ({mark})", (request["item"],))
            if request.get("fail_after_write"):
                raise RuntimeError("failed after writing")
            order = 0
        else:
            order = effects.add(request["item"])
        context.set_trailing_metadata((("order-id", str(order)),))
        if request.get("abort"):
            context.abort(grpc.StatusCode[request["abort"]], f"ended with {request['abort']}")
        return {"order": order, "item": request["item"]}

    return create


def _create_async(effects: Effects) -> Any:
    async def create(request: dict[str, Any], context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        _seen(context)
        await asyncio.to_thread(_start, request)
        if (code := _fail_first(request)) is not None:
            await context.abort(grpc.StatusCode[code], "failed first")
        await asyncio.sleep(request.get("hold", 0))
        if request.get("fail"):
            raise RuntimeError("the handler failed")
        if request.get("tx"):
            conn = await retrysafe.transaction()
            sql = f"INSERT INTO {request['tx']} (item) VALUES (?)"
            await _aexecute(conn, sql, request["item"])
            if request.get("fail_after_write"):
                raise RuntimeError("failed after writing")
            order = 0
        else:
            order = await asyncio.to_thread(effects.add, request["item"])
        context.set_trailing_metadata((("order-id", str(order)),))
        if request.get("abort"):
            code = grpc.StatusCode[request["abort"]]
            await context.abort(code, f"ended with {request['abort']}")
        return {"order": order, "item": request["item"]}

    return create


async def _aexecute(conn: Any, sql: str, *args: Any) -> None:
    """One statement on an async store's transaction connection (aiosqlite-like or asyncpg)."""
    if type(conn).__module__.startswith("asyncpg"):
        await conn.execute(sql.replace("?", "$1"), *args)
    else:
        result = conn.execute(sql, args)
        if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
            await result


def _watch(request: dict[str, Any], context: Any) -> Iterator[dict[str, Any]]:
    yield {"n": 1}
    yield {"n": 2}


async def _awatch(request: dict[str, Any], context: Any) -> AsyncIterator[dict[str, Any]]:
    yield {"n": 1}
    yield {"n": 2}


def _upload(requests: Iterator[dict[str, Any]], context: Any) -> dict[str, Any]:
    return {"count": sum(1 for _ in requests)}


async def _aupload(requests: AsyncIterator[dict[str, Any]], context: Any) -> dict[str, Any]:
    return {"count": len([r async for r in requests])}


def handlers(effects: Effects, *, aio: bool = False) -> grpc.GenericRpcHandler:
    """The service's generic handler (JSON messages)."""
    create = _create_async(effects) if aio else _create_sync(effects)
    codec = {"request_deserializer": loads, "response_serializer": dumps}
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Create": grpc.unary_unary_rpc_method_handler(create, **codec),
            "Watch": grpc.unary_stream_rpc_method_handler(_awatch if aio else _watch, **codec),
            "Upload": grpc.stream_unary_rpc_method_handler(_aupload if aio else _upload, **codec),
        },
    )


def serve(port: int, store: str, effects: Path, aio: bool, lease: float) -> None:
    """Serve until killed (the crash tests' child process)."""
    from retrysafe.contrib.grpc import AsyncIdempotencyInterceptor, IdempotencyInterceptor

    if aio:

        async def main() -> None:
            interceptor = AsyncIdempotencyInterceptor(store=store, lease=lease)
            server = grpc.aio.server(interceptors=[interceptor])
            server.add_generic_rpc_handlers((handlers(Effects(effects), aio=True),))
            server.add_insecure_port(f"127.0.0.1:{port}")
            await server.start()
            print("serving", flush=True)
            await server.wait_for_termination()

        asyncio.run(main())
        return
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        interceptors=[IdempotencyInterceptor(store=store, lease=lease)],
    )
    server.add_generic_rpc_handlers((handlers(Effects(effects)),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("serving", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    args = sys.argv[1:]
    lease = 30.0
    if "--lease" in args:
        at = args.index("--lease")
        lease = float(args[at + 1])
        del args[at : at + 2]
    serve(int(args[0]), args[1], Path(args[2]), len(args) > 3 and args[3] == "aio", lease)
