"""The services a page's projects may start with ``with=NAME:PORT`` (see :mod:`.harness`).

Each runs from the test environment (not the project's), on the port the harness chose: a page's
client snippet talks to OrderHub as ``make demo`` serves it, and the proxy's snippet needs a
backend that has no idempotency of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from ..e2e.servers import DemoServer
from ..proxy.conftest import Backend
from .harness import Service

__all__ = ["SERVICES"]


@contextlib.contextmanager
def _running(server: DemoServer | Backend, port: int) -> Iterator[None]:
    server.port = port
    server.start()
    try:
        yield
    finally:
        server.stop()


def orderhub(port: int, folder: Path) -> contextlib.AbstractContextManager[None]:
    """OrderHub (``retrysafe demo``) on a SQLite store in the project's folder."""
    return _running(DemoServer(f"sqlite:///{folder}/orderhub.db", log_dir=folder / "logs"), port)


def backend(port: int, folder: Path) -> contextlib.AbstractContextManager[None]:
    """The proxy tests' idempotency-free backend (standard library only)."""
    return _running(Backend(folder / "logs", folder / "effects.jsonl"), port)


SERVICES: dict[str, Service] = {"orderhub": orderhub, "backend": backend}
