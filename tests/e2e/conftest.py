from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .servers import DemoServer


@pytest.fixture
def demo_servers(tmp_path: Path) -> Iterator[Callable[..., DemoServer]]:
    """Factory of started demo processes; every one is stopped after the test."""
    started: list[DemoServer] = []

    def start(store: str, **kwargs: Any) -> DemoServer:
        server = DemoServer(store, log_dir=tmp_path / "logs", **kwargs)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()
