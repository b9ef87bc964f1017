"""Serving OrderHub on each framework: ``retrysafe demo --framework NAME``.

Each entry of :data:`SERVERS` builds that framework's OrderHub (the same HTTP contract, DESIGN
section 5) and serves it in the foreground until interrupted. The frameworks are imported only
by the entry that runs (``retrysafe --help`` needs none of them).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import import_module

from .. import ConfigurationError
from .charges import WorkerLink, run_worker
from .domain import options_of

__all__ = ["SERVERS", "WORKER_FRAMEWORKS", "serve_asgi", "worker", "worker_link"]

#: The frameworks whose OrderHub sends each payment to the Celery worker (``GET /charges``).
WORKER_FRAMEWORKS = ("starlette", "fastapi", "flask")


def worker_link(args: argparse.Namespace) -> WorkerLink | None:
    """The link to the demo's Celery worker, before it runs (``None``: no worker, with
    ``--no-worker``, on a framework without one, with a ``memory://`` store, or without Celery
    installed)."""
    if getattr(args, "no_worker", True) or args.framework not in WORKER_FRAMEWORKS:
        return None
    if args.store.startswith("memory:"):
        # Each worker process would have its own memory: no key would be shared.
        print("No worker: a memory:// store is not shared with the worker's processes", flush=True)
        return None
    try:
        import celery  # noqa: F401
    except ImportError:
        print("No worker: pip install 'retrysafe[demo]' installs Celery", flush=True)
        return None
    return WorkerLink(args.broker)


@contextmanager
def worker(args: argparse.Namespace, link: WorkerLink | None) -> Iterator[None]:
    """Run the demo's Celery worker as a child process while the block serves (no worker
    without ``link``)."""
    if link is None:
        yield
        return
    print(
        f"OrderHub's Celery worker: celery -A retrysafe.demo.worker worker (broker {link.broker})",
        flush=True,
    )
    with run_worker(link, store=args.store, db=args.db, ttl=args.ttl, lease=args.lease):
        yield


def serve_asgi(args: argparse.Namespace, module: str) -> None:
    """Serve the ``create_app`` of ``retrysafe.demo.<module>`` under uvicorn (one process)."""
    import uvicorn

    create_app = import_module(f"retrysafe.demo.{module}").create_app
    link = worker_link(args)
    try:
        app = create_app(**options_of(args, link))
    except ValueError as exc:  # a driver's own URL parsing (e.g. redis-py's options)
        raise ConfigurationError(f"invalid store URL: {exc}") from exc
    with worker(args, link):  # started once the app's settings are known to be good
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


#: framework name -> server; the first is the default (what ``make demo`` serves).
SERVERS: dict[str, Callable[[argparse.Namespace], None]] = {
    "starlette": lambda args: serve_asgi(args, "app"),
    "fastapi": lambda args: serve_asgi(args, "fastapi_app"),
    "flask": lambda args: import_module("retrysafe.demo.flask_app").serve(args),
    "django": lambda args: import_module("retrysafe.demo.django_app.serve").serve_django(args),
}
