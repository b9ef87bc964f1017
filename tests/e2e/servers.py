"""Start real ``retrysafe demo`` processes on free loopback ports (for end-to-end tests)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx

__all__ = ["DemoServer", "free_port", "serving"]


def free_port() -> int:
    """Return a TCP port that is free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def serving(
    argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], log: Path, ready: str
) -> Iterator[subprocess.Popen[bytes]]:
    """Run a server process (its output in ``log``) until ``GET ready`` answers 200, yield it,
    and stop it (SIGTERM, then SIGKILL after 15 s)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(ready, timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class DemoServer:
    """One ``retrysafe demo`` process.

    Args:
        store: the ``--store`` URL.
        db: the ``--db`` URL (``None``: the demo's default).
        lease: ``--lease`` seconds.
        ttl: ``--ttl`` seconds.
        log_dir: where its output goes (a file per server, kept for failed tests).
        worker: also start OrderHub's Celery worker (``--broker`` a folder under ``log_dir``);
            by default ``--no-worker``, so the tests of the web app start no worker.
    """

    def __init__(
        self,
        store: str,
        *,
        db: str | None = None,
        lease: float = 30.0,
        ttl: float = 3600.0,
        log_dir: Path,
        extra_args: tuple[str, ...] = (),
        worker: bool = False,
    ) -> None:
        self.store = store
        self.db = db
        self.lease = lease
        self.ttl = ttl
        self.log_dir = log_dir
        self.extra_args = extra_args
        self.worker = worker
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL of the server."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> DemoServer:
        """Start the process and wait until it answers."""
        cmd = [
            sys.executable,
            "-m",
            "retrysafe",
            "demo",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--store",
            self.store,
            "--lease",
            str(self.lease),
            "--ttl",
            str(self.ttl),
            "--log-level",
            "warning",
            *self.extra_args,
        ]
        if self.db:
            cmd += ["--db", self.db]
        if self.worker:
            cmd += ["--broker", f"filesystem://{self.log_dir}/broker-{self.port}"]
        else:
            cmd.append("--no-worker")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"demo-{self.port}.log", "ab")  # noqa: SIM115
        # Never this test run's Django settings (tests/django sets them in this process): the
        # server, and any Celery worker it starts, configures itself as it would for a user.
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"demo exited with {self.proc.returncode}: {self.log_text()}")
            try:
                httpx.get(self.url + "/orders?limit=0", timeout=1.0)
                return self
            except httpx.TransportError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"demo did not answer within {timeout} s: {self.log_text()}")

    def log_text(self) -> str:
        """The server's output so far."""
        path = self.log_dir / f"demo-{self.port}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self) -> None:
        """SIGKILL the process (a crash: no cleanup runs)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Terminate the process gracefully (SIGKILL if it does not stop)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
