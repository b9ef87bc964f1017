"""taskiq with real ``taskiq worker`` processes on the Redis stream broker (acknowledged after
the result is saved; an unacknowledged message delivered again after 5 s idle) and SIGKILLed
workers: each task's effect happens once, none is lost, and a task kicked twice with one key is
answered with the first one's result."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from .conftest import services
from .crash import Plan, Setup
from .queues import (
    QueueWorker,
    check_control,
    check_recovered,
    short_plan,
    taskiq_broker,
)

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(120)
def test_a_task_kicked_twice_with_one_key_runs_once(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    services(request, "redis")
    from taskiq.kicker import AsyncKicker

    from retrysafe.contrib.taskiq import idempotency_key

    setup = Setup(Plan("taskiq", "redis", "sqlite", work=1.0), tmp_path)
    worker = QueueWorker(setup, 0)
    labels = idempotency_key(f"order-{uuid.uuid4().hex}")

    async def kick_twice() -> list[object]:
        broker = taskiq_broker(setup)
        await broker.startup()
        try:
            kicker = AsyncKicker(task_name="tasks_charge", broker=broker, labels=labels)
            tasks = [await kicker.kiq("o-1", 100) for _ in range(2)]
            return [(await t.wait_result(timeout=60)).return_value for t in tasks]
        finally:
            await broker.shutdown()

    try:
        results = asyncio.run(kick_twice())
        assert results == [{"order_id": "o-1", "amount": 100}] * 2
        assert [k for k, _ in setup.rows()] == ["o-1"]
        assert (setup.count("executed"), setup.count("replayed")) == (1, 1)
    finally:
        worker.stop()
        setup.drop()


@pytest.mark.timeout(300)
def test_each_task_runs_once_across_killed_workers(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A worker SIGKILLed mid-run: the stream delivers its unacknowledged messages again to the
    other worker after 5 s idle, and each runs once."""
    services(request, "redis", "postgres")
    # the kill comes early: a worker takes many messages at once and is soon done
    check_recovered(short_plan("taskiq"), tmp_path, recovery=5)


@pytest.mark.timeout(120)
def test_the_control_without_retrysafe_runs_duplicates(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The same run with a plain taskiq task: the producer's second copies run again."""
    services(request, "redis", "postgres")
    check_control("taskiq", tmp_path)


def test_the_check_names_what_loses_or_repeats_a_task() -> None:
    from taskiq import InMemoryBroker
    from taskiq_redis import RedisStreamBroker

    from retrysafe.contrib.taskiq import Idempotency, idempotent_task

    name = f"tasks_check_{uuid.uuid4().hex}"

    @idempotent_task(store="memory://", ttl=60, name=name)
    async def short(order_id: str) -> str:
        return order_id

    def check(broker: object) -> list[str]:
        middleware = Idempotency()
        middleware.set_broker(broker)  # type: ignore[arg-type]
        return middleware.check()

    (lost,) = check(InMemoryBroker())
    assert "is lost, not delivered again" in lost
    slow = check(RedisStreamBroker("redis://127.0.0.1:6379"))
    assert any("idle_timeout is 600 s" in m for m in slow)
    assert any(name in m and "ttl (60 s)" in m for m in slow)
    quick = RedisStreamBroker("redis://127.0.0.1:6379", idle_timeout=30_000)
    lock = [m for m in check(quick) if "reclaim lock" in m]
    assert check(quick) == lock
    assert bool(lock) == (getattr(quick, "unacknowledged_lock_timeout", None) is None)
