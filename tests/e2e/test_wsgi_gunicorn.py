"""The WSGI middleware under gunicorn with several worker processes: one effect for many
concurrent duplicates, a SIGKILLed worker's key freed after its lease, a lost response replayed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from ..conftest import RUN_ID
from ..stores.backend_postgres import fresh_table_url
from .servers import free_port

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
LEASE = 1.5


class Gunicorn:
    """One gunicorn master serving ``tests.e2e.wsgi_app:app`` with ``workers`` sync workers."""

    def __init__(self, store: str, workdir: Path, workers: int = 2) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workdir = workdir
        self.log = workdir / "gunicorn.log"
        env = {
            **os.environ,
            "RETRYSAFE_TEST_STORE": store,
            "RETRYSAFE_TEST_LEASE": str(LEASE),
            "WSGI_TEST_DIR": str(workdir),
            "PYTHONUNBUFFERED": "1",
        }
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gunicorn",
                    "--bind",
                    f"127.0.0.1:{self.port}",
                    "--workers",
                    str(workers),
                    "--worker-class",
                    "sync",
                    "--timeout",
                    "60",
                    "--chdir",
                    str(ROOT),
                    "tests.e2e.wsgi_app:app",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                httpx.get(self.url + "/orders", timeout=1.0)
                return
            except httpx.TransportError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"gunicorn did not answer: {self.log.read_text()}")

    def effects(self) -> int:
        count: int = httpx.get(self.url + "/orders", timeout=5).json()["count"]
        return count

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store every worker process shares."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    if request.param == "postgres":
        return fresh_table_url(request)
    base: str = request.getfixturevalue("redis_url")
    return f"{base}?prefix=rs-wsgi-{RUN_ID}-{uuid.uuid4().hex[:8]}:"


@pytest.fixture
def server(store_url: str, tmp_path: Path) -> Iterator[Gunicorn]:
    workdir = tmp_path / "work"
    workdir.mkdir()
    gunicorn = Gunicorn(store_url, workdir)
    yield gunicorn
    gunicorn.stop()


def _key() -> dict[str, str]:
    return {"Idempotency-Key": f'"{uuid.uuid4()}"'}


def test_twenty_concurrent_duplicates_across_workers_give_one_effect(server: Gunicorn) -> None:
    # A burst proves the claim across processes only when both workers answered some of it; on a
    # busy machine the second worker may still be booting, or the kernel may hand one worker every
    # connection, so a burst answered by one process is followed by another (a new key each).
    pids: set[str] = set()
    for burst in range(1, 6):
        headers = {**_key(), "X-Sleep": "0.5"}

        def post(_: int, headers: dict[str, str] = headers) -> httpx.Response:
            return httpx.post(
                server.url + "/orders", json={"item": "x"}, headers=headers, timeout=30
            )

        with ThreadPoolExecutor(20) as pool:
            responses = list(pool.map(post, range(20)))
        statuses = sorted(r.status_code for r in responses)
        assert set(statuses) <= {201, 409}, statuses
        originals = [
            r for r in responses if r.status_code == 201 and "idempotency-replayed" not in r.headers
        ]
        assert len(originals) == 1
        assert all(r.headers["retry-after"] for r in responses if r.status_code == 409)
        assert server.effects() == burst
        pids = {r.headers["x-worker-pid"] for r in responses}
        if len(pids) == 2:
            break
    assert len(pids) == 2, "five bursts in a row were answered by one worker process"
    # Once the first is done, every retry is its replay.
    again = httpx.post(server.url + "/orders", json={"item": "x"}, headers=headers, timeout=30)
    assert again.headers["idempotency-replayed"] == "true"
    assert again.content == originals[0].content
    assert server.effects() == burst


def test_a_sigkilled_worker_frees_its_key_and_the_retry_runs_once(
    server: Gunicorn, tmp_path: Path
) -> None:
    key = _key()
    marker = f"started-{uuid.uuid4().hex}"
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(
            httpx.post,
            server.url + "/orders",
            json={"item": "crash"},
            headers={**key, "X-Sleep": "30", "X-Marker": marker},
            timeout=30,
        )
        path = server.workdir / marker
        deadline = time.monotonic() + 10
        # The worker creates the marker, then writes its pid into it: wait for both.
        while not (path.exists() and path.read_text()) and time.monotonic() < deadline:
            time.sleep(0.02)
        pid = int(path.read_text())
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(httpx.TransportError):
            first.result()
    # The dead worker's key is taken over as soon as the store sees its owner is dead (at once
    # on SQLite and PostgreSQL, within the heartbeat TTL on Redis), at the latest after the lease.
    deadline = time.monotonic() + LEASE + 10
    while True:
        retry = httpx.post(server.url + "/orders", json={"item": "crash"}, headers=key, timeout=10)
        if retry.status_code != 409 or time.monotonic() > deadline:
            break
        time.sleep(float(retry.headers.get("retry-after", "1")) / 4)
    assert retry.status_code == 201
    assert "idempotency-replayed" not in retry.headers
    assert retry.headers["x-worker-pid"] != str(pid)
    replay = httpx.post(server.url + "/orders", json={"item": "crash"}, headers=key, timeout=10)
    assert replay.headers["idempotency-replayed"] == "true"
    assert server.effects() == 1


def test_a_client_that_disconnects_mid_request_gets_the_replay_on_retry(server: Gunicorn) -> None:
    key = _key()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            server.url + "/orders",
            json={"item": "lost"},
            headers={**key, "X-Sleep-After": "1.0"},
            timeout=httpx.Timeout(10, read=0.3),
        )
    deadline = time.monotonic() + 10
    while True:
        retry = httpx.post(server.url + "/orders", json={"item": "lost"}, headers=key, timeout=10)
        if retry.status_code != 409 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert retry.status_code == 201
    assert retry.headers["idempotency-replayed"] == "true"
    assert server.effects() == 1
