"""Serving OrderHub on each framework: ``retrysafe demo --framework NAME``.

Each entry of :data:`SERVERS` builds that framework's OrderHub (the same HTTP contract, DESIGN
section 5) and serves it in the foreground until interrupted.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from importlib import import_module

from .._core.errors import ConfigurationError

__all__ = ["SERVERS", "serve_fastapi", "serve_starlette"]


def serve_starlette(args: argparse.Namespace, *, fastapi: bool = False) -> None:
    """OrderHub on Starlette (or FastAPI), served by uvicorn (one process)."""
    import uvicorn

    from .app import create_app

    try:
        app = create_app(
            store=args.store, db=args.db, ttl=args.ttl, lease=args.lease, fastapi=fastapi
        )
    except ValueError as exc:  # a driver's own URL parsing (e.g. redis-py's options)
        raise ConfigurationError(f"invalid store URL: {exc}") from exc
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


def serve_fastapi(args: argparse.Namespace) -> None:
    """OrderHub on FastAPI, served by uvicorn (one process)."""
    serve_starlette(args, fastapi=True)


#: framework name -> server; the first is the default (what ``make demo`` serves).
SERVERS: dict[str, Callable[[argparse.Namespace], None]] = {
    "starlette": serve_starlette,
    "fastapi": serve_fastapi,
    "flask": lambda args: import_module("retrysafe.demo.flask_app").serve(args),
    "django": lambda args: import_module("retrysafe.demo.django_app.serve").serve_django(args),
}
