"""Huey with a real ``huey_consumer`` process (thread workers), a real Redis and a SIGKILLed
consumer: a task enqueued twice with one key runs once and both callers read the first run's
result; a consumer killed mid-task loses the task (Huey has no acknowledgement), and the
producer's re-enqueue with the same key runs each key once."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from .conftest import services
from .crash import Plan, Setup
from .queues import QueueWorker, check_control, huey_task

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(120)
def test_a_task_enqueued_twice_with_one_key_runs_once(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    services(request, "redis")
    setup = Setup(Plan("huey", "redis", "sqlite", work=1.0, concurrency=2), tmp_path)
    worker = QueueWorker(setup, 0)
    huey, charge = huey_task(setup)
    key = f"order-{uuid.uuid4().hex}"
    try:
        results = [charge("o-1", 100, idempotency_key=key) for _ in range(2)]
        values = [r.get(blocking=True, timeout=60) for r in results]
        assert values == [{"order_id": "o-1", "amount": 100}] * 2
        assert [k for k, _ in setup.rows()] == ["o-1"]
        assert (setup.count("executed"), setup.count("replayed")) == (1, 1)
    finally:
        worker.stop()
        huey.storage.conn.close()
        setup.drop()


@pytest.mark.timeout(150)
def test_a_killed_consumers_tasks_enqueued_again_run_once(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Six tasks of up to 4 s on two threads; the consumer is SIGKILLed while two run; the
    producer enqueues all six again (what Huey's users do: Huey does not deliver a killed
    consumer's task again) to a new consumer: each key's effect exactly once, the keys that
    had finished answered from the store."""
    services(request, "redis", "postgres")
    setup = Setup(Plan("huey", "redis", "postgres", work=2.0, concurrency=2), tmp_path)
    worker = QueueWorker(setup, 0)
    huey, charge = huey_task(setup)
    keys = [f"order-{n}" for n in range(6)]
    try:
        for key in keys:
            charge(key, 100)
        deadline = time.monotonic() + 30
        while setup.count("received") < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        worker.kill()
        cut = {k for k, _ in setup.rows()}
        started = setup.count("received")
        assert started - len(cut) >= 1, "the kill landed between tasks"
        worker.start()
        for key in keys:
            charge(key, 100)
        # the tasks the killed consumer never took are still queued: the new one runs them too
        while time.monotonic() < deadline + 60:
            if {k for k, _ in setup.rows()} == set(keys):
                break
            time.sleep(0.2)
        time.sleep(2)  # any second effect would show by now
        rows = [k for k, _ in setup.rows()]
        assert sorted(rows) == keys, (rows, cut)
        assert setup.count("replayed") >= len(cut)
    finally:
        worker.stop()
        huey.storage.conn.close()
        setup.drop()


@pytest.mark.timeout(120)
def test_the_control_without_retrysafe_runs_duplicates(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A plain Huey task: the producer's second copies run again."""
    services(request, "redis", "postgres")
    check_control("huey", tmp_path, workers=1)


def test_the_check_names_a_huey_without_results() -> None:
    from huey import MemoryHuey

    from retrysafe.contrib.huey import check_huey, idempotent_task

    kept, dropped = MemoryHuey("kept"), MemoryHuey("dropped", results=False)
    for huey in (kept, dropped):
        huey.task()(idempotent_task(huey, store="memory://")(lambda order_id: order_id))
    assert check_huey(kept) == []
    (message,) = check_huey(dropped)
    assert "results=False" in message
