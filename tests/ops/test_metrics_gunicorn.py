"""Multiprocess metrics under gunicorn: a SIGKILLed worker's in-flight request stops counting
(the child_exit hook), while its counters stay in the totals."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ..e2e.servers import free_port, serving

pytestmark = pytest.mark.e2e

ORDER = b'{"item": "tea", "quantity": 1}'
JSON = {"Content-Type": "application/json"}
CONFIG = """
from retrysafe.contrib.prometheus import gunicorn_child_exit as child_exit
"""


@pytest.fixture
def gunicorn(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    multiproc = tmp_path / "prom"
    multiproc.mkdir()
    (tmp_path / "gunicorn.conf.py").write_text(CONFIG)
    port = free_port()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(multiproc), "PYTHONUNBUFFERED": "1"}
    url = f"http://127.0.0.1:{port}"
    argv = [
        sys.executable,
        "-m",
        "gunicorn",
        "-c",
        str(tmp_path / "gunicorn.conf.py"),
        "-k",
        "uvicorn.workers.UvicornWorker",
        "-w",
        "2",
        "-b",
        f"127.0.0.1:{port}",
        "--graceful-timeout",
        "2",
        "retrysafe.demo.app:create_app()",
    ]
    with serving(
        argv, cwd=tmp_path, env=env, log=tmp_path / "gunicorn.log", ready=url + "/orders?limit=0"
    ):
        yield url, multiproc


def _sample(url: str, name: str, **labels: str) -> float:
    response = httpx.get(url + "/metrics", timeout=10, headers={"Connection": "close"})
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return 0.0


def _wait_for(check: object, what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_killed_workers_in_flight_request_stops_counting(gunicorn: tuple[str, Path]) -> None:
    url, multiproc = gunicorn
    orders = {"route": "/orders", "store": "sqlite"}
    failures: list[BaseException] = []

    def slow() -> None:
        headers = {**JSON, "Idempotency-Key": '"slow"'}
        try:
            httpx.post(url + "/orders?delay_ms=60000", content=ORDER, headers=headers, timeout=90)
        except httpx.TransportError as exc:  # its worker is killed under it
            failures.append(exc)

    client = threading.Thread(target=slow, daemon=True)
    client.start()
    in_flight = "retrysafe_in_flight_requests"
    _wait_for(lambda: _sample(url, in_flight, **orders) == 1, "the request never showed")
    executed = {"outcome": "executed", **orders}
    _wait_for(lambda: _sample(url, "retrysafe_requests_total", **executed) == 1, "no count")
    # The worker running it is the only one with a live gauge file.
    (gauge,) = multiproc.glob("gauge_livesum_*.db")
    pid = int(gauge.stem.rsplit("_", 1)[-1])
    os.kill(pid, signal.SIGKILL)
    client.join(timeout=30)
    assert failures, "the killed worker's client got an answer"
    _wait_for(lambda: _sample(url, in_flight, **orders) == 0, "the dead worker still counts")
    assert not (multiproc / gauge.name).exists()
    # Its counter stays in the totals, and the new worker keeps counting on top of it.
    assert _sample(url, "retrysafe_requests_total", **executed) == 1
    headers = {**JSON, "Idempotency-Key": '"after"'}
    assert httpx.post(url + "/orders", content=ORDER, headers=headers, timeout=10).is_success
    _wait_for(lambda: _sample(url, "retrysafe_requests_total", **executed) == 2, "lost count")
