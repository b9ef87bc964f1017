"""Real processes for the proxy tests: the backend of ``backend.py`` and ``retrysafe proxy``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..conftest import service_missing
from ..e2e.servers import free_port

#: The same backend in two languages (neither has any idempotency).
BACKENDS = {
    "python": [sys.executable, str(Path(__file__).with_name("backend.py"))],
    "node": ["node", str(Path(__file__).with_name("backend.js"))],
}


class Process:
    """One child process with its output in a log file (shown when a test fails)."""

    def __init__(self, name: str, log_dir: Path) -> None:
        self.name = name
        self.log_dir = log_dir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL of the server."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}-{self.port}.log"

    def log_text(self) -> str:
        """What the process printed so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _spawn(self, cmd: list[str], env: dict[str, str], probe: str, timeout: float) -> None:
        if self.proc is not None:  # a restart: the previous process must be gone (and reaped)
            self.proc.wait(timeout=10)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}: {self.log_text()}")
            try:
                if httpx.get(self.url + probe, timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer within {timeout} s: {self.log_text()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exited(self, timeout: float = 5.0) -> bool:
        """Whether the process ends within ``timeout`` (its sockets close a moment before its
        exit is visible, so a peer can see the connection drop before ``alive()`` turns)."""
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL the process: a crash, no clean-up runs."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Terminate gracefully (SIGKILL after 10 s)."""
        if not self.alive():
            return
        assert self.proc is not None
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()


class Backend(Process):
    """The idempotency-free backend of ``backend.py``; effects go to a JSON-lines file."""

    def __init__(self, log_dir: Path, effects: Path, language: str = "python") -> None:
        super().__init__(f"backend-{language}", log_dir)
        self.effects_path = effects
        self.language = language
        if language == "node" and shutil.which("node") is None:
            service_missing("Node.js", "no node on PATH")

    def start(self) -> Backend:
        cmd = [*BACKENDS[self.language], "--port", str(self.port)]
        cmd += ["--effects", str(self.effects_path)]
        self._spawn(cmd, dict(os.environ), "/health", 15.0)
        return self

    def effects(self, **match: Any) -> list[dict[str, Any]]:
        """Effects recorded so far whose fields equal ``match``."""
        if not self.effects_path.exists():
            return []
        lines = self.effects_path.read_text().splitlines()
        found = [json.loads(line) for line in lines if line.strip()]
        return [e for e in found if all(e.get(k) == v for k, v in match.items())]


class Proxy(Process):
    """A real ``retrysafe proxy`` process."""

    def __init__(
        self,
        log_dir: Path,
        upstream: str,
        store: str,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__("proxy", log_dir)
        self.upstream = upstream
        self.store = store
        self.args = args
        self.env = env or {}

    def start(self, timeout: float = 30.0) -> Proxy:
        """Start it; the upstream goes in ``--upstream`` unless ``RETRYSAFE_UPSTREAM`` is set."""
        cmd = [sys.executable, "-m", "retrysafe", "proxy", "--listen", f"127.0.0.1:{self.port}"]
        if "RETRYSAFE_UPSTREAM" not in self.env:
            cmd += ["--upstream", self.upstream]
        cmd += ["--store", self.store, "--log-level", "warning", *self.args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        self._spawn(cmd, env, "/-/healthz", timeout)
        return self


class Processes:
    """Starts backends and proxies; stops every one it started (see the fixtures)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[Process] = []

    def backend(
        self, effects: Path | None = None, port: int | None = None, language: str = "python"
    ) -> Backend:
        effects = effects or self.log_dir / f"effects-{len(self.started)}"
        backend = Backend(self.log_dir, effects, language)
        if port is not None:
            backend.port = port
        self.started.append(backend)
        return backend.start()

    def proxy(self, upstream: str, store: str, *args: str, **kwargs: Any) -> Proxy:
        proxy = Proxy(self.log_dir, upstream, store, args, **kwargs)
        self.started.append(proxy)
        return proxy.start()

    def stop_all(self) -> None:
        for process in reversed(self.started):
            process.stop()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    """Processes started by one test, stopped after it."""
    started = Processes(tmp_path / "logs")
    yield started
    started.stop_all()


@pytest.fixture(scope="module")
def module_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processes]:
    """Processes shared by the tests of one module, stopped after them."""
    started = Processes(tmp_path_factory.mktemp("proxy") / "logs")
    yield started
    started.stop_all()


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    """A plain HTTP client for one test."""
    with httpx.Client(timeout=10.0) as c:
        yield c
