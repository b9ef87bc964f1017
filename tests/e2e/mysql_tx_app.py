"""An orders app in transactional mode on the MySQL store, for the SIGKILL tests:
``python -m tests.e2e.mysql_tx_app asgi|wsgi STORE_URL TABLE PORT``.

``POST /orders`` with ``{"order": ID}`` inserts ID into TABLE on the request's transaction (the
driver's connection: asyncmy behind ASGI, PyMySQL behind WSGI, ``%s`` placeholders), sleeps
``X-Sleep-After`` seconds (the window in which a kill separates the write from the commit),
and answers ``201`` with the order. The ASGI app is served by uvicorn, the WSGI app by the
standard library's server; each prints ``ready`` once it listens.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import retrysafe
from retrysafe import wsgi


def asgi_app(store: str, table: str) -> Any:
    from retrysafe.asgi import IdempotencyMiddleware

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        order = json.loads(body)["order"]
        conn = await retrysafe.transaction(scope)
        async with conn.cursor() as cur:
            await cur.execute(f"INSERT INTO {table} (k) VALUES (%s)", (order,))
        headers = dict(scope["headers"])
        await asyncio.sleep(float(headers.get(b"x-sleep-after", b"0")))
        out = json.dumps({"order": order}).encode()
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": out})

    return IdempotencyMiddleware(app, store=store, transactional=True, lease=2.0)


def wsgi_app(store: str, table: str) -> Any:
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        order = json.loads(environ["wsgi.input"].read(length))["order"]
        with wsgi.transaction(environ).cursor() as cur:
            cur.execute(f"INSERT INTO {table} (k) VALUES (%s)", (order,))
        time.sleep(float(environ.get("HTTP_X_SLEEP_AFTER", "0")))
        start_response("201 Created", [("Content-Type", "application/json")])
        return [json.dumps({"order": order}).encode()]

    return wsgi.IdempotencyMiddleware(app, store=store, transactional=True, lease=2.0)


def main(argv: list[str]) -> None:
    kind, store, table, port = argv
    if kind == "asgi":
        import uvicorn

        config = uvicorn.Config(
            asgi_app(store, table), host="127.0.0.1", port=int(port), log_level="warning"
        )

        class Announcing(uvicorn.Server):
            async def startup(self, sockets: Any = None) -> None:
                await super().startup(sockets)
                print("ready", flush=True)

        Announcing(config).run()
    else:
        from wsgiref.simple_server import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

        with make_server("127.0.0.1", int(port), wsgi_app(store, table), handler_class=Quiet) as s:
            print("ready", flush=True)
            s.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
