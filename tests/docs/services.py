"""The services a page's projects may start with ``with=NAME:PORT`` (see :mod:`.harness`).

Each runs from the test environment (not the project's), on the port the harness chose: a page's
client snippet talks to OrderHub as ``make demo`` serves it, and the proxy's snippet needs a
backend that has no idempotency of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import AMQP_URL, POSTGRES_URL, REDIS_URL
from ..e2e.servers import DemoServer
from ..proxy.conftest import Backend
from .harness import Project, Service, services_named

__all__ = ["SERVICES", "require_services"]

#: The fixture that skips (or fails under CI=true) without each test service.
_FIXTURES = {REDIS_URL: "redis_url", POSTGRES_URL: "postgres_url", AMQP_URL: "rabbitmq_url"}


def require_services(request: pytest.FixtureRequest, project: Project) -> None:
    """Skip (or fail, in CI) a project whose blocks name a test service that is not up."""
    for url in services_named("\n".join(block.code for block in project.blocks)):
        request.getfixturevalue(_FIXTURES[url])


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
