"""A real ``retrysafe demo --framework django`` server (gunicorn, several worker processes) on a
free loopback port, and an isolated PostgreSQL schema for one: shared by tests/django and the
end-to-end tests."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import psycopg
import pytest

from ..conftest import RUN_ID
from ..e2e.servers import free_port

_schemas = itertools.count(1)


def pg_schema_url(request: pytest.FixtureRequest) -> str:
    """A PostgreSQL URL whose connections use a fresh run-unique schema (dropped at the end)."""
    url: str = request.getfixturevalue("postgres_url")
    schema = f"rs_dj_{RUN_ID}_{next(_schemas)}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')

    def drop() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    request.addfinalizer(drop)
    return f"{url}?options={quote(f'-csearch_path={schema}')}"


class DjangoDemo:
    """One Django OrderHub: a gunicorn master and its workers, in a process group of their own
    so that :meth:`kill` SIGKILLs them all at once (a crash of the whole host).

    Args:
        store: the ``--store`` URL (a SQL one: the Django ORM store on that database).
        workdir: where its log goes (and relative SQLite paths live).
        lease: ``--lease`` seconds.
        workers: gunicorn worker processes.
        asgi: serve the ASGI application under uvicorn instead (one process: the middleware's
            async runner), after ``manage.py migrate``.
    """

    def __init__(
        self,
        store: str,
        workdir: Path,
        *,
        lease: float = 30.0,
        workers: int = 3,
        asgi: bool = False,
    ) -> None:
        self.asgi = asgi
        self.store = store
        self.workdir = workdir
        self.lease = lease
        self.workers = workers
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / f"django-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> DjangoDemo:
        """Start and wait until it answers."""
        cmd = [
            sys.executable, "-m", "retrysafe", "demo", "--framework", "django",
            "--host", "127.0.0.1", "--port", str(self.port), "--store", self.store,
            "--lease", str(self.lease), "--ttl", "3600", "--log-level", "warning",
        ]  # fmt: skip
        env = {
            **os.environ,
            "RETRYSAFE_DEMO_WORKERS": str(self.workers),
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("DJANGO_SETTINGS_MODULE", None)
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.asgi:
            env.update(
                DJANGO_SETTINGS_MODULE="retrysafe.demo.django_app.settings",
                RETRYSAFE_DEMO_STORE=self.store,
                RETRYSAFE_DEMO_LEASE=str(self.lease),
            )
            migrate = [sys.executable, "-m", "django", "migrate", "-v0"]
            subprocess.run(migrate, cwd=self.workdir, env=env, check=True, timeout=60)
            cmd = [
                sys.executable, "-m", "uvicorn", "retrysafe.demo.django_app.asgi:application",
                "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning",
            ]  # fmt: skip
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.text()}")
            try:
                if httpx.get(self.url + "/orders?limit=0", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server did not answer within {timeout} s: {self.text()}")

    def text(self) -> str:
        """The server's output so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL the master and every worker (no cleanup runs anywhere)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop gracefully (SIGKILL after 10 s)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()


@pytest.fixture
def django_demo(tmp_path: Path) -> object:
    """Factory of started Django OrderHubs; all are stopped after the test."""
    started: list[DjangoDemo] = []

    def start(store: str, **kwargs: object) -> DjangoDemo:
        server = DjangoDemo(store, tmp_path, **kwargs)  # type: ignore[arg-type]
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()
