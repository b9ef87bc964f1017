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
def orderhub(port: int, folder: Path) -> Iterator[DemoServer]:
    """OrderHub (``retrysafe demo``) on a SQLite store in the project's folder."""
    server = DemoServer(f"sqlite:///{folder}/orderhub.db", log_dir=folder / "logs")
    server.port = port
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def backend(port: int, folder: Path) -> Iterator[Backend]:
    """The proxy tests' idempotency-free backend (standard library only)."""
    server = Backend(folder / "logs", folder / "effects.jsonl")
    server.port = port
    server.start()
    try:
        yield server
    finally:
        server.stop()


SERVICES: dict[str, Service] = {"orderhub": orderhub, "backend": backend}
