"""Huey with a real ``huey_consumer`` process (thread workers), a real Redis and a SIGKILLed
consumer: a task enqueued twice with one key runs once and both callers read the first run's
result; a consumer killed mid-task (Huey has no acknowledgement) has its keyed tasks enqueued
again by a live consumer once its heartbeat lapses, each run once; a producer that enqueues
them again too changes nothing. In-process (real Redis): a live slow task is never swept, and a
dead consumer's task is enqueued again once however many consumers sweep."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import services
from .crash import Plan, Setup
from .queues import QueueWorker, check_control, check_recovered, huey_task, short_plan

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
    producer enqueues all six again (what Huey's users did before retrysafe kept a killed
    consumer's tasks, and may still do) to a new consumer, which also enqueues the killed
    consumer's running tasks again: each key's effect exactly once, the keys that had finished
    answered from the store."""
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


@pytest.mark.timeout(400)
def test_each_task_runs_once_across_killed_workers(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two consumers, one SIGKILLed the moment one of its tasks starts: the task it ran, which
    Huey had already taken off the queue, is enqueued again by a live consumer once the dead
    one's heartbeat lapses, and runs once (nothing lost, no second effect, every second copy
    answered from the stored result)."""
    services(request, "redis", "postgres")
    check_recovered(short_plan("huey"), tmp_path, recovery=8)


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


@pytest.fixture
def consumers(redis_url: str, tmp_path: Path) -> Iterator[Callable[[int], Any]]:
    """``consumers(n)``: ``n`` consumer processes' views of one Huey queue, in this process:
    each its own Huey instance (its own heartbeat and sweeps, a heartbeat of 1 s) with the same
    idempotent task on one SQLite store. The task logs its run and waits for ``release``."""
    from huey import RedisHuey

    from retrysafe.contrib import huey as contrib

    name = f"tasks_kept_{uuid.uuid4().hex[:8]}"
    release, runs, views = threading.Event(), [], []

    def make(count: int) -> Any:
        for _ in range(count):
            huey = RedisHuey(name, url=redis_url)

            def charge(order_id: str) -> str:
                runs.append(order_id)
                release.wait(30)
                return order_id

            keyed = contrib.idempotent_task(
                huey, store=f"sqlite:///{tmp_path}/store.db", key="order_id", heartbeat=1
            )
            views.append((huey, huey.task(name="charge")(keyed(charge))))
        return views, release, runs

    yield make
    release.set()
    for huey, _ in views:
        contrib._kept[id(huey)].stop()
    if views:
        conn = views[0][0].storage.conn
        for key in conn.scan_iter(match=f"huey.*{name}*"):
            conn.delete(key)
    for huey, _ in views:
        huey.storage.conn.close()


def _entry(huey: Any, task_id: str) -> bool:
    """Whether ``task_id`` has a running entry on ``huey``'s Redis storage."""
    return bool(huey.storage.conn.hexists(f"huey.retrysafe.running.{huey.name}", task_id))


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _running(huey: Any, charge: Any) -> tuple[Any, Any, threading.Thread]:
    """Enqueue ``charge("o-1")`` and run it on ``huey`` in a thread, as a consumer's worker
    does, until its running entry is written: its result handle, the task and the thread."""
    result = charge("o-1")
    task = huey.dequeue()
    runner = threading.Thread(target=huey.execute, args=(task,))
    runner.start()
    _until(lambda: _entry(huey, task.id), "the task's entry was never written")
    return result, task, runner


@pytest.mark.timeout(60)
def test_a_live_slow_task_is_never_enqueued_again(consumers: Callable[[int], Any]) -> None:
    """A task running for three heartbeats while another consumer sweeps every tenth of one:
    its consumer's heartbeat goes on while it runs, so no sweep takes it; its running entry is
    removed when it ends."""
    from retrysafe.contrib import huey as contrib

    ((first, charge), (second, _)), release, runs = consumers(2)
    result, task, runner = _running(first, charge)
    sweeper = contrib._kept[id(second)]
    sweeper.start()
    until = time.monotonic() + 3
    while time.monotonic() < until:
        assert sweeper.sweep() == 0
        assert first.storage.queue_size() == 0
        time.sleep(0.1)
    assert _entry(first, task.id)
    release.set()
    runner.join(10)
    assert result.get(blocking=True, timeout=10) == "o-1"
    assert not _entry(first, task.id)
    assert runs == ["o-1"]


@pytest.mark.timeout(60)
def test_a_dead_consumers_task_is_enqueued_again_once(consumers: Callable[[int], Any]) -> None:
    """Consumer A runs a task and goes silent (its heartbeat stops and lapses, as when it is
    SIGKILLed); B and C sweep at the same moment: the task is enqueued again once, with its id;
    the copy, run by B after A's run had finished, is answered from the store."""
    from retrysafe.contrib import huey as contrib

    ((a, charge), (b, _), (c, _)), release, runs = consumers(3)
    result, task, runner = _running(a, charge)
    dead = contrib._kept[id(a)]
    dead.stop()
    a.storage.conn.delete(dead.alive + dead.owner.decode())  # its heartbeat lapses
    sweepers = [contrib._kept[id(b)], contrib._kept[id(c)]]
    for sweeper in sweepers:
        sweeper.start()
    threads = [threading.Thread(target=sweeper.sweep) for sweeper in sweepers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    # an entry is dropped once its copy is enqueued
    _until(lambda: not _entry(a, task.id), "the dead consumer's task was not swept")
    assert b.storage.queue_size() == 1
    release.set()
    runner.join(10)
    copy = b.dequeue()
    assert copy.id == task.id
    b.execute(copy)
    assert runs == ["o-1"]
    assert result.get(blocking=True, timeout=10) == "o-1"


def test_the_check_names_a_storage_that_loses_a_killed_task(tmp_path: Path) -> None:
    from huey import MemoryHuey, SqliteHuey

    from retrysafe.contrib.huey import check_huey, idempotent_task

    sqlite = SqliteHuey("sql", filename=str(tmp_path / "huey.db"))
    memory = MemoryHuey("memory")  # a consumer in the producer's process: nothing to lose
    for huey in (sqlite, memory):
        huey.task()(idempotent_task(huey, store="memory://")(lambda order_id: order_id))
    (message,) = check_huey(sqlite)
    assert "SqliteStorage" in message and "Redis storages only" in message
    assert check_huey(memory) == []
    sqlite.storage.close()


def test_a_heartbeat_is_one_second_or_more_and_one_per_huey(redis_url: str) -> None:
    from huey import RedisHuey

    from retrysafe import ConfigurationError
    from retrysafe.contrib.huey import idempotent_task

    huey = RedisHuey(f"tasks_beat_{uuid.uuid4().hex[:8]}", url=redis_url)
    try:
        with pytest.raises(ConfigurationError, match=r"heartbeat=0\.5"):
            idempotent_task(huey, store="memory://", heartbeat=0.5)(lambda order_id: order_id)
        idempotent_task(huey, store="memory://", heartbeat=5)(lambda order_id: order_id)
        with pytest.raises(ConfigurationError, match="must give the same"):
            idempotent_task(huey, store="memory://", heartbeat=6)(lambda order_id: order_id)
    finally:
        huey.storage.conn.close()
