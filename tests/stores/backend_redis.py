"""The Redis backend of the conformance suite: the real server, a key prefix unique to the test."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from retrysafe.stores.redis import AsyncRedisStore, RedisStore

from ..conftest import RUN_ID, service_missing
from ..e2e.servers import free_port
from .conftest import Backend, real_sleep


def with_prefix(url: str, prefix: str) -> str:
    """Add ``?prefix=`` to a Redis URL (keeping any query it has)."""
    return f"{url}{'&' if '?' in url else '?'}prefix={prefix}"


def delete_prefixed(url: str, prefix: str) -> int:
    """Delete the keys under ``prefix`` only (never FLUSHDB: the server is shared)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        return int(client.delete(*keys)) if keys else 0
    finally:
        client.close()


def unique_prefix(tag: str = "test") -> str:
    """A key prefix no other test or run uses."""
    return f"rs-{tag}-{RUN_ID}-{uuid.uuid4().hex[:8]}:"


async def redis_backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    """Yield the Redis async store and its sync twin over one prefix; delete the prefix after."""
    base: str = request.getfixturevalue("redis_url")
    prefix = unique_prefix()
    url = with_prefix(base, prefix)
    store = AsyncRedisStore(url)
    sync = RedisStore(url)
    try:
        yield Backend("redis", store, sync, real_sleep, url=url, purge_counts=False)
    finally:
        await store.aclose()
        sync.close()
        delete_prefixed(base, prefix)


class PrivateRedis:
    """A redis-server process of the test's own, on a free port (for faults and SCRIPT FLUSH).

    The shared server on 6379 is never stopped, flushed or reconfigured: other test runs use it.

    Args:
        workdir: the server's working directory (it saves nothing there; ``--save ''``).
        port: the port (default: a free one); reuse it to restart the "same" server.
    """

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """URL of the server (database 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> PrivateRedis:
        """Start the server and wait until it answers PING."""
        import redis

        binary = shutil.which("redis-server")
        if binary is None:
            service_missing("redis-server binary", "not on PATH")
        assert binary is not None
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--daemonize", "no", "--dir", str(self.workdir)]
        self.proc = subprocess.Popen(
            [binary, *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            try:
                client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
                try:
                    client.ping()
                    return self
                finally:
                    client.close()
            except redis.RedisError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not answer in {timeout} s")

    def stop(self) -> None:
        """Kill the server (SIGKILL: a crash, not a shutdown)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
