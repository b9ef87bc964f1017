"""A small WSGI orders app behind ``retrysafe.wsgi.IdempotencyMiddleware``, served by gunicorn in
the end-to-end tests. No framework: the middleware is pure WSGI.

Configured by the environment: ``RETRYSAFE_TEST_STORE`` (the store URL), ``RETRYSAFE_TEST_LEASE``
(seconds) and ``WSGI_TEST_DIR`` (where the effects database and the markers go). Knobs are
headers, so that a retry can drop them and still be the same request (the fingerprint covers the
method, path, query and body): ``X-Sleep`` (seconds before the effect), ``X-Sleep-After`` (after
it) and ``X-Marker`` (a file written with the worker's pid when the handler starts).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable
from contextlib import closing
from pathlib import Path
from typing import Any

from retrysafe.wsgi import IdempotencyMiddleware

DIR = Path(os.environ.get("WSGI_TEST_DIR", "."))


def _effects() -> sqlite3.Connection:
    conn = sqlite3.connect(DIR / "effects.db", timeout=30, isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY KEY, pid INT, body TEXT)")
    return conn


def orders(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """``POST /orders``: one row in the effects database per run; ``GET``: the row count."""
    if environ["REQUEST_METHOD"] != "POST":
        with closing(_effects()) as conn:
            count = conn.execute("SELECT count(*) FROM effects").fetchone()[0]
        start_response("200 OK", [("Content-Type", "application/json")])
        return [json.dumps({"count": count}).encode()]
    body = environ["wsgi.input"].read()
    marker = environ.get("HTTP_X_MARKER")
    if marker:
        (DIR / marker).write_text(str(os.getpid()))
    time.sleep(float(environ.get("HTTP_X_SLEEP", "0")))
    with closing(_effects()) as conn:
        row_id = conn.execute(
            "INSERT INTO effects (pid, body) VALUES (?, ?)", (os.getpid(), body.decode())
        ).lastrowid
    time.sleep(float(environ.get("HTTP_X_SLEEP_AFTER", "0")))
    payload = json.dumps({"id": row_id, "pid": os.getpid()}).encode()
    start_response(
        "201 Created",
        [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(payload))),
            ("Location", f"/orders/{row_id}"),
        ],
    )
    return [payload]


def _with_pid(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    # Outside the middleware: every answer (409s too) says which worker process gave it.
    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            return start_response(status, [*headers, ("X-Worker-Pid", str(os.getpid()))], exc_info)

        return app(environ, start)

    return wrapped


app = _with_pid(
    IdempotencyMiddleware(
        orders,
        store=os.environ.get("RETRYSAFE_TEST_STORE", "memory://"),
        lease=float(os.environ.get("RETRYSAFE_TEST_LEASE", "30")),
    )
)
