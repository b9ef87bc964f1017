"""Real OrderHub processes for the client tests (``retrysafe demo`` on free loopback ports)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from ..e2e.servers import DemoServer


@pytest.fixture(scope="module")
def orderhub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoServer]:
    """One OrderHub per test module: SQLite store, orders in the same file (transactional)."""
    root = tmp_path_factory.mktemp("orderhub")
    server = DemoServer(f"sqlite:///{root}/orderhub.db", lease=2.0, log_dir=root / "logs")
    server.start()
    yield server
    server.stop()


def orders_by_item(server: DemoServer, prefix: str) -> Counter[str]:
    """How many orders exist per item name starting with ``prefix`` (read from the server)."""
    listing = httpx.get(server.url + "/orders", timeout=10).json()
    return Counter(o["item"] for o in listing["orders"] if o["item"].startswith(prefix))
