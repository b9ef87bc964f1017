"""Serving OrderHub on each framework: ``retrysafe demo --framework NAME``.

Each entry of :data:`SERVERS` builds that framework's OrderHub (the same HTTP contract, DESIGN
section 5) and serves it in the foreground until interrupted. The frameworks are imported only
by the entry that runs (``retrysafe --help`` needs none of them).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from importlib import import_module

from .._core.errors import ConfigurationError
from .domain import Settings

__all__ = ["SERVERS", "serve_asgi"]


def serve_asgi(args: argparse.Namespace, module: str) -> None:
    """Serve the ``create_app`` of ``retrysafe.demo.<module>`` under uvicorn (one process)."""
    import uvicorn

    create_app = import_module(f"retrysafe.demo.{module}").create_app
    try:
        app = create_app(Settings.from_args(args))
    except ValueError as exc:  # a driver's own URL parsing (e.g. redis-py's options)
        raise ConfigurationError(f"invalid store URL: {exc}") from exc
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


#: framework name -> server; the first is the default (what ``make demo`` serves).
SERVERS: dict[str, Callable[[argparse.Namespace], None]] = {
    "starlette": lambda args: serve_asgi(args, "app"),
    "fastapi": lambda args: serve_asgi(args, "fastapi_app"),
    "flask": lambda args: import_module("retrysafe.demo.flask_app").serve(args),
    "django": lambda args: import_module("retrysafe.demo.django_app.serve").serve_django(args),
}
