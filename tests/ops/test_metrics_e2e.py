"""OrderHub's /metrics under a real two-worker uvicorn, scraped over HTTP (multiprocess mode)."""

from __future__ import annotations

import os
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


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """OrderHub (SQLite store in tmp_path) under ``uvicorn --workers 2``, multiprocess metrics."""
    multiproc = tmp_path / "prom"
    multiproc.mkdir()
    port = free_port()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(multiproc), "PYTHONUNBUFFERED": "1"}
    url = f"http://127.0.0.1:{port}"
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "retrysafe.demo.app:create_app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "2",
        "--log-level",
        "warning",
    ]
    with serving(
        argv, cwd=tmp_path, env=env, log=tmp_path / "uvicorn.log", ready=url + "/orders?limit=0"
    ):
        yield url, multiproc


def _scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    # A fresh connection per scrape, so the scrapes land on either worker.
    response = httpx.get(url + "/metrics", timeout=10, headers={"Connection": "close"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def _get(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def _pids_with_counters(multiproc: Path) -> set[str]:
    return {p.stem.rsplit("_", 1)[-1] for p in multiproc.glob("counter_*.db")}


def test_metrics_of_both_workers_add_up_in_every_scrape(two_workers: tuple[str, Path]) -> None:
    url, multiproc = two_workers
    new_keys = 0
    replays = 0
    # Fresh connections until both workers have served keyed requests (bounded).
    deadline = time.monotonic() + 20
    while len(_pids_with_counters(multiproc)) < 2 and new_keys < 120:
        assert time.monotonic() < deadline
        for _ in range(4):
            headers = {**JSON, "Idempotency-Key": f'"k{new_keys}"', "Connection": "close"}
            first = httpx.post(url + "/orders", content=ORDER, headers=headers, timeout=10)
            assert first.status_code == 201
            again = httpx.post(url + "/orders", content=ORDER, headers=headers, timeout=10)
            assert again.headers["idempotency-replayed"] == "true"
            assert again.content == first.content
            new_keys += 1
            replays += 1
    assert len(_pids_with_counters(multiproc)) == 2, "one worker served every request"
    mismatch = httpx.post(
        url + "/orders",
        content=b'{"item": "coffee", "quantity": 2}',
        headers={**JSON, "Idempotency-Key": '"k0"'},
        timeout=10,
    )
    assert mismatch.status_code == 422
    missing = httpx.post(
        url + "/payments", content=b'{"amount": 5, "currency": "EUR"}', headers=JSON, timeout=10
    )
    assert missing.status_code == 400
    assert missing.json()["code"] == "idempotency_key_missing"
    total = "retrysafe_requests_total"
    orders = {"route": "/orders", "store": "sqlite"}
    # Each worker writes its counts out every second (multiprocess mode): wait for them.
    deadline = time.monotonic() + 10
    while _get(_scrape(url), total, outcome="mismatch", **orders) < 1:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(1.2)  # one more flush period: every worker has written everything
    for _ in range(6):
        samples = _scrape(url)
        assert _get(samples, total, outcome="executed", **orders) == new_keys
        assert _get(samples, total, outcome="replayed", **orders) == replays
        assert _get(samples, total, outcome="mismatch", **orders) == 1
        assert _get(samples, total, outcome="missing_key", route="/payments", store="sqlite") == 1
        assert _get(samples, "retrysafe_in_flight_requests", **orders) == 0
        latency = "retrysafe_store_operation_seconds_count"
        # Each replay and the mismatch cost one reserve; OrderHub commits in transactional mode.
        assert _get(samples, latency, operation="reserve", store="sqlite") == (
            new_keys + replays + 1
        )
        assert _get(samples, latency, operation="commit", store="sqlite") == new_keys
        # Never a raw path or key in a label.
        for _, labels in samples:
            assert all('"k' not in v and not v.startswith("/orders/") for _, v in labels)


def _in_flight(url: str) -> float:
    return _get(_scrape(url), "retrysafe_in_flight_requests", route="/orders", store="sqlite")


def test_in_flight_gauge_shows_a_running_request_to_every_scrape(
    two_workers: tuple[str, Path],
) -> None:
    url, _ = two_workers
    with httpx.Client(timeout=30) as client:
        done: list[int] = []

        def slow() -> None:
            headers = {**JSON, "Idempotency-Key": '"slow"'}
            done.append(
                client.post(
                    url + "/orders?delay_ms=3000", content=ORDER, headers=headers
                ).status_code
            )

        worker = threading.Thread(target=slow)
        worker.start()
        deadline = time.monotonic() + 10
        while _in_flight(url) != 1:  # written within a flush period
            assert time.monotonic() < deadline and worker.is_alive()
            time.sleep(0.1)
        assert [_in_flight(url) for _ in range(4)] == [1, 1, 1, 1]  # whichever worker answers
        worker.join(timeout=20)
        assert done == [201]
        deadline = time.monotonic() + 10
        while _in_flight(url) != 0:
            assert time.monotonic() < deadline
            time.sleep(0.1)
