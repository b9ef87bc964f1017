"""OrderHub's Celery worker, for real: ``retrysafe demo`` with its ``celery worker`` child
(prefork, the file-system broker), payments charged by the worker, a duplicate enqueue, and a
SIGKILL of the worker process mid-charge with retrysafe (one charge) and without (two). Every
count is read from the demo's database through ``GET /charges``."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..stores import backend_mysql
from .servers import DemoServer

pytest.importorskip("celery", reason="the demo's worker needs Celery (pip install -e '.[demo]')")

pytestmark = pytest.mark.e2e

PAYMENT = {"amount": 10, "currency": "EUR"}


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoServer]:
    """One OrderHub with its worker for the module (a worker start costs seconds). Stopped,
    ``retrysafe demo`` stops its worker too."""
    tmp = tmp_path_factory.mktemp("worker")
    server = DemoServer(f"sqlite:///{tmp}/store.db", log_dir=tmp / "logs", worker=True)
    server.start()
    worker_pid = _charges(server)["worker_pid"]
    yield server
    server.stop()
    assert _gone(worker_pid), "the worker outlived retrysafe demo"


def _charges(server: DemoServer) -> dict[str, Any]:
    response = httpx.get(server.url + "/charges", timeout=10)
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def _entry(server: DemoServer, payment_id: int, flow: str) -> dict[str, Any] | None:
    return next(
        (
            p
            for p in _charges(server)["payments"]
            if p["payment_id"] == payment_id and p["flow"] == flow
        ),
        None,
    )


def _settled(
    server: DemoServer, payment_id: int, flow: str, runs: int, timeout: float = 30.0
) -> dict[str, Any]:
    """The payment's entry once it has ``runs`` runs, none of them still running."""
    deadline = time.monotonic() + timeout
    while True:
        entry = _entry(server, payment_id, flow)
        runs_now = [] if entry is None else entry["runs"]
        finished = all(run["outcome"] != "running" for run in runs_now)
        if entry is not None and len(runs_now) >= runs and finished:
            return entry
        assert time.monotonic() < deadline, (entry, server.log_text()[-4000:])
        time.sleep(0.2)


def _pay(server: DemoServer, key: str) -> httpx.Response:
    headers = {"Idempotency-Key": key}
    return httpx.post(server.url + "/payments", json=PAYMENT, headers=headers, timeout=10)


def test_a_payment_is_charged_once_by_the_worker(hub: DemoServer) -> None:
    first = _pay(hub, '"pay-once"')
    assert first.status_code == 201, first.text
    payment_id = first.json()["id"]
    entry = _settled(hub, payment_id, "retrysafe", runs=1)
    assert entry["charges"] == 1
    assert [run["outcome"] for run in entry["runs"]] == ["charged"]
    # The client's retry is answered from the stored response: nothing is sent again.
    again = _pay(hub, '"pay-once"')
    assert again.headers["idempotency-replayed"] == "true"
    time.sleep(1.0)
    assert _settled(hub, payment_id, "retrysafe", runs=1)["runs"] == entry["runs"]


def test_a_duplicate_enqueue_is_answered_from_the_stored_result(hub: DemoServer) -> None:
    payment_id = _pay(hub, '"pay-twice"').json()["id"]
    _settled(hub, payment_id, "retrysafe", runs=1)
    sent = httpx.post(f"{hub.url}/payments/{payment_id}/charge", timeout=10)
    assert sent.status_code == 202, sent.text
    entry = _settled(hub, payment_id, "retrysafe", runs=2)
    assert [run["outcome"] for run in entry["runs"]] == [
        "charged",
        "answered from the stored result",
    ]
    assert entry["charges"] == 1


def test_a_worker_killed_mid_charge_charges_once_with_retrysafe_twice_without(
    hub: DemoServer,
) -> None:
    killed = {}
    for flow in ("retrysafe", "plain"):
        response = httpx.post(f"{hub.url}/worker/kill?flow={flow}", timeout=30)
        assert response.status_code == 202, response.text
        killed[flow] = response.json()
    entries = {
        flow: _settled(hub, answer["payment_id"], flow, runs=2) for flow, answer in killed.items()
    }
    for flow, entry in entries.items():
        first, redelivered = entry["runs"][:2]
        assert first["outcome"] == "killed (SIGKILL)"
        assert first["pid"] == killed[flow]["killed_pid"] != redelivered["pid"]
        assert first["task_id"] == redelivered["task_id"]  # the same message, delivered again
        assert redelivered["outcome"] == "charged"
    # Counted in the database: the killed run's charge rolled back with its record and the
    # redelivery charged once; without retrysafe the killed run's charge stays and the
    # redelivery charges again.
    assert entries["retrysafe"]["charges"] == 1
    assert entries["plain"]["charges"] == 2


def test_unknown_flow_and_payment_are_problems(hub: DemoServer) -> None:
    bad = httpx.post(f"{hub.url}/worker/kill?flow=other", timeout=10)
    assert bad.status_code == 400
    assert bad.headers["content-type"] == "application/problem+json"
    missing = httpx.post(f"{hub.url}/payments/999999/charge", timeout=10)
    assert missing.status_code == 404


def _gone(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_the_worker_never_outlives_the_demo(
    demo_servers: Callable[..., DemoServer], tmp_path: Path
) -> None:
    """SIGKILLed, ``retrysafe demo`` runs no cleanup: its worker notices that its parent is
    gone and stops by itself (stopped, the demo stops it: the ``hub`` fixture)."""
    server = demo_servers(f"sqlite:///{tmp_path}/store.db", worker=True)
    worker_pid = _charges(server)["worker_pid"]
    assert isinstance(worker_pid, int)
    os.kill(worker_pid, 0)  # alive
    server.kill()
    assert _gone(worker_pid), "the worker outlived a SIGKILLed retrysafe demo"


def test_without_the_worker_the_charges_routes_say_so(
    demo_servers: Callable[..., DemoServer], tmp_path: Path
) -> None:
    server = demo_servers(f"sqlite:///{tmp_path}/store.db")
    response = httpx.get(server.url + "/charges", timeout=10)
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize("framework", ["fastapi", "flask"])
def test_the_other_orderhubs_send_their_payments_to_the_worker_too(
    demo_servers: Callable[..., DemoServer], tmp_path: Path, framework: str
) -> None:
    server = demo_servers(
        f"sqlite:///{tmp_path}/store.db", worker=True, extra_args=("--framework", framework)
    )
    payment_id = _pay(server, f'"{framework}-pay"').json()["id"]
    entry = _settled(server, payment_id, "retrysafe", runs=1)
    assert entry["charges"] == 1 and entry["runs"][0]["outcome"] == "charged"
    if framework == "fastapi":
        spec = httpx.get(server.url + "/openapi.json", timeout=10).json()
        assert "/charges" not in spec["paths"]  # the demo's own controls, not the API


@pytest.mark.parametrize("framework", ["starlette", "flask"])
def test_on_mysql_the_worker_charges_once_and_a_killed_charge_once(
    demo_servers: Callable[..., DemoServer], request: pytest.FixtureRequest, framework: str
) -> None:
    """MySQL has no ``RETURNING``: the worker writes its charges and runs all the same, and a
    charge killed mid-task rolls back with its record in the same MySQL database."""
    store = backend_mysql.fresh_database_url(request)
    server = demo_servers(store, worker=True, extra_args=("--framework", framework))
    payment_id = _pay(server, f'"{framework}-mysql-pay"').json()["id"]
    entry = _settled(server, payment_id, "retrysafe", runs=1)
    assert entry["charges"] == 1 and entry["runs"][0]["outcome"] == "charged"
    # Stamped by the insert as on every database (a MySQL column default cannot be).
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["runs"][0]["started_at"])
    charges = {}
    for flow in ("retrysafe", "plain"):
        response = httpx.post(f"{server.url}/worker/kill?flow={flow}", timeout=30)
        assert response.status_code == 202, response.text
        killed = response.json()
        entry = _settled(server, killed["payment_id"], flow, runs=2)
        assert [run["outcome"] for run in entry["runs"][:2]] == ["killed (SIGKILL)", "charged"]
        charges[flow] = entry["charges"]
    assert charges == {"retrysafe": 1, "plain": 2}
