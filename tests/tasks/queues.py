"""The crash run (:mod:`tests.tasks.crash`) on RQ, arq and Huey workers: each queue's worker
command, its producer, and a kill that takes the worker's children too (RQ's work-horse leaves
its worker's process group right after the fork, so a group kill would leave it running).

``crash_run(plan, tmp)`` is :func:`tests.tasks.crash.crash_run` with these workers and
producers (``queue_workers()`` around the Celery tests' ``check``); ``plan.queue`` names the
queue (``rq``, ``arq``, ``huey``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from . import crash
from .crash import Outcome, Plan, Setup

BIN = Path(sys.executable).parent

#: The control with the queue's own deduplication: the job id is the business key (RQ's
#: ``job_id=``, arq's ``_job_id``), as their users write it.
OWN_DEDUP = os.environ.get("TASKS_OWN_DEDUP") == "1"


class QueueWorker(crash.Worker):
    """One worker of ``setup.plan.queue``; a kill is a SIGKILL to it and all its descendants."""

    def __init__(self, setup: Setup, index: int) -> None:
        plan, q = setup.plan, setup.queue
        if plan.queue == "rq":
            command = [
                *(str(BIN / "rq"), "worker", "-w", "retrysafe.contrib.rq.Worker"),
                *("--url", setup.broker, "--maintenance-interval", "1"),
                *("--job-monitoring-interval", "1", q),
            ]
            self.ready = "Listening on"
        elif plan.queue == "arq":
            command = [str(BIN / "arq"), "tests.tasks.arq_app.WorkerSettings"]
            self.ready = "Starting worker"
            setup.env["TASKS_CONCURRENCY"] = str(plan.concurrency)
        elif plan.queue == "huey":
            command = [
                *(str(BIN / "huey_consumer"), "tests.tasks.huey_app.huey"),
                *("-w", str(plan.concurrency), "-k", "thread"),
            ]
            self.ready = "Huey consumer started"
        elif plan.queue == "taskiq":
            command = [
                *(str(BIN / "taskiq"), "worker", "tests.tasks.taskiq_app:broker"),
                *("--workers", "1", "--max-async-tasks", str(plan.concurrency)),
                *("--ack-type", "when_saved"),
            ]
            self.ready = "Listening started"
        else:  # pragma: no cover - the other queues join here
            raise ValueError(plan.queue)
        self.command = command
        self.setup = setup
        self.log = open(Path(setup.events).with_name(f"worker{index}.log"), "a")  # noqa: SIM115
        self.start()

    def start(self) -> None:
        """Start the worker and wait until it takes jobs (its log says so): the run's kill is
        timed from the sends, so it must not land on a worker still starting."""
        path = Path(self.log.name)
        seen = path.read_text().count(self.ready)
        super().start()
        deadline = time.monotonic() + 30
        while path.read_text().count(self.ready) == seen and time.monotonic() < deadline:
            time.sleep(0.05)

    def kill(self) -> None:
        family = crash.descendants(self.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        self.kill()
        self.log.close()


def _producer(setup: Setup) -> tuple[Callable[[str], None], Callable[[], None]]:
    plan = setup.plan
    if plan.queue == "rq":
        from redis import Redis
        from rq import Queue, Retry

        connection = Redis.from_url(setup.broker)
        queue = Queue(setup.queue, connection=connection)

        def send(key: str) -> None:
            # job ids under the run's prefix: the run's clean-up finds them
            queue.enqueue(
                "tests.tasks.rq_app.charge",
                key,
                100,
                retry=Retry(max=3),
                job_id=f"{setup.queue}-{key if OWN_DEDUP else uuid.uuid4().hex[:12]}",
                result_ttl=60,
                failure_ttl=60,
            )

        return send, connection.close
    if plan.queue == "arq":
        return _arq_producer(setup)
    if plan.queue == "huey":
        return _huey_producer(setup)
    if plan.queue == "taskiq":
        return _taskiq_producer(setup)
    raise ValueError(plan.queue)  # pragma: no cover


def huey_task(setup: Setup) -> tuple[Any, Any]:
    """The run's Huey and a task that enqueues the consumer's (Huey names a task by its
    function's module and its name: the consumer's module, here)."""
    from huey import RedisHuey

    def charge(order_id: str, amount: int, **_: Any) -> None:
        raise AssertionError("run by the consumer, never here")

    charge.__module__ = "tests.tasks.huey_app"
    huey = RedisHuey(setup.queue, url=setup.broker)
    return huey, huey.task(name="tasks_charge")(charge)


def _huey_producer(setup: Setup) -> tuple[Callable[[str], None], Callable[[], None]]:
    huey, charge = huey_task(setup)

    def send(key: str) -> None:
        charge(key, 100)

    return send, huey.storage.conn.close


def taskiq_broker(setup: Setup) -> Any:
    """A broker of the run's stream, with its result backend (not started)."""
    from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

    backend = RedisAsyncResultBackend(setup.broker, prefix_str=setup.queue)
    return RedisStreamBroker(
        setup.broker, queue_name=setup.queue, consumer_group_name=setup.queue
    ).with_result_backend(backend)


def _taskiq_producer(setup: Setup) -> tuple[Callable[[str], None], Callable[[], None]]:
    """Sends the run's tasks, and a no-op task every half second until the run ends: steady
    traffic, which taskiq-redis's stream broker needs to take a dead worker's messages over (it
    runs XAUTOCLAIM only after XREADGROUP returned a new message)."""
    from taskiq.kicker import AsyncKicker

    loop = asyncio.new_event_loop()
    broker = taskiq_broker(setup)
    loop.run_until_complete(broker.startup())
    charge = AsyncKicker(task_name="tasks_charge", broker=broker, labels={})
    tick = AsyncKicker(task_name="tasks_tick", broker=broker, labels={})
    lock = threading.Lock()
    done = threading.Event()

    def send(key: str) -> None:
        with lock:
            loop.run_until_complete(charge.kiq(key, 100))

    def ticks() -> None:
        while not done.wait(0.5):
            with lock:
                loop.run_until_complete(tick.kiq())

    ticker = threading.Thread(target=ticks, daemon=True)
    ticker.start()

    def close() -> None:
        done.set()
        ticker.join()
        loop.run_until_complete(broker.shutdown())
        loop.close()

    return send, close


def _arq_producer(setup: Setup) -> tuple[Callable[[str], None], Callable[[], None]]:
    from arq import create_pool
    from arq.connections import RedisSettings

    loop = asyncio.new_event_loop()
    pool = loop.run_until_complete(create_pool(RedisSettings.from_dsn(setup.broker)))

    def send(key: str) -> None:
        # under the run's prefix (cleaned up); the key itself for arq's own deduplication
        job_id = f"{setup.queue}-{key if OWN_DEDUP else uuid.uuid4().hex[:12]}"
        enqueue = pool.enqueue_job("charge", key, 100, _job_id=job_id, _queue_name=setup.queue)
        loop.run_until_complete(enqueue)

    def close() -> None:
        loop.run_until_complete(pool.aclose())
        loop.close()

    return send, close


@contextlib.contextmanager
def queue_workers() -> Iterator[None]:
    """Within it, :func:`tests.tasks.crash.crash_run` (and the checks that call it) starts these
    queues' workers and producers."""
    with (
        mock.patch.object(crash, "Worker", QueueWorker),
        mock.patch.object(crash, "_producer", _producer),
    ):
        yield


def crash_run(plan: Plan, tmp: Path) -> Outcome:
    """:func:`tests.tasks.crash.crash_run` on ``plan.queue``'s workers and producer."""
    with queue_workers():
        return crash.crash_run(plan, tmp)


def rq_result(connection: Any, job_id: str) -> Any:
    """An RQ job's return value (``None`` until it has one)."""
    from rq.job import Job

    return Job.fetch(job_id, connection=connection).return_value()


def short_plan(queue: str, store: str = "postgres", seed: int = 20) -> Plan:
    """The short crash tests' run: 20 jobs of up to 1 s on two workers of two slots, some sent
    twice, one SIGKILL aimed at a worker the moment one of its jobs starts."""
    return Plan(
        queue, "redis", store, tasks=20, kills=1, workers=2, work=0.5, seed=seed, aimed=True
    )


def check_recovered(plan: Plan, tmp: Path, recovery: float, attempts: int = 3) -> Outcome:
    """Run ``plan`` and check it as the Celery runs are (no duplicate, none lost, every second
    copy answered), and that the kill landed in a run: a key whose first effect came
    ``recovery`` seconds or more after its send was the killed worker's, run again. On a loaded
    machine an aimed kill can still land after its job ended (a job of a few milliseconds, or a
    worker that acknowledged early): every run is checked, and one is made again (up to
    ``attempts`` runs, a seed each) until a kill lands in a job."""
    from .test_chaos import check_outcome

    for attempt in range(attempts):
        run = dataclasses.replace(plan, seed=plan.seed + attempt)
        folder = tmp / f"run{attempt}"  # a run names its own queue, tables and keys
        folder.mkdir(exist_ok=True)
        outcome = crash_run(run, folder)
        print(outcome.line())
        check_outcome(outcome)
        if outcome.kills == 1 and max(outcome.latencies) >= recovery:
            return outcome
    raise AssertionError(f"no kill landed in a running job in {attempts} runs: {outcome.line()}")


def check_control(queue: str, tmp: Path, workers: int = 2) -> None:
    """The run with a plain job (no retrysafe): the producer's second copies run again."""
    plan = Plan(queue, "redis", "none", tasks=20, kills=0, workers=workers, work=0.05)
    outcome = crash_run(plan, tmp)
    print(outcome.line())
    assert outcome.duplicates >= outcome.sends - 20 > 0, outcome.line()
