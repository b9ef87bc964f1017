"""A small ASGI app for the owner-liveness tests, served by uvicorn: every run of ``POST /effects``
writes one row to an effects database (so "exactly one effect" can be counted), with knobs in
headers (a retry drops them and stays the same request: the fingerprint covers method, path,
query and body).

Environment: ``LIVENESS_STORE`` (store URL), ``LIVENESS_EFFECTS`` (SQLite file of the effects).
Headers: ``X-Sleep`` seconds awaited before the effect (a slow, live handler), ``X-Spin`` seconds of
CPU-bound work that blocks the event loop before the effect, ``X-Commit-Then-Sleep`` seconds
slept after the effect and ``mark_committed`` (the window where a crash leaves "outcome unknown").
Routes: ``/effects`` runs with the app's lease (30 s); ``/short`` with a 1.5 s lease.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from contextlib import closing

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from retrysafe import idempotent, mark_committed
from retrysafe.asgi import IdempotencyMiddleware


def _effects() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ["LIVENESS_EFFECTS"], timeout=30, isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY KEY, key TEXT, pid INT)")
    return conn


async def effects(request: Request) -> Response:
    """One effect row per run; ``GET`` counts the rows per key."""
    if request.method == "GET":
        with closing(_effects()) as conn:
            rows = conn.execute("SELECT key, count(*) FROM effects GROUP BY key").fetchall()
        return JSONResponse(dict(rows))
    await request.body()
    key = request.headers["idempotency-key"]
    await asyncio.sleep(float(request.headers.get("x-sleep", "0")))
    spin_until = time.monotonic() + float(request.headers.get("x-spin", "0"))
    while time.monotonic() < spin_until:  # CPU-bound: the event loop cannot run meanwhile
        sum(range(1000))
    with closing(_effects()) as conn:
        conn.execute("INSERT INTO effects (key, pid) VALUES (?, ?)", (key, os.getpid()))
    after = float(request.headers.get("x-commit-then-sleep", "0"))
    if after:
        await mark_committed(request)
        await asyncio.sleep(after)
    return JSONResponse({"key": key, "pid": os.getpid()}, status_code=201)


@idempotent(lease=1.5)
async def short(request: Request) -> Response:
    """``/effects`` with a 1.5 s lease."""
    return await effects(request)


app = Starlette(
    routes=[
        Route("/effects", effects, methods=["GET", "POST"]),
        Route("/short", short, methods=["POST"]),
    ],
    middleware=[
        Middleware(
            IdempotencyMiddleware,
            store=os.environ.get("LIVENESS_STORE", "memory://"),
            lease=30.0,
        )
    ],
)
