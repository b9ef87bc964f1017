"""RQ with real ``rq worker`` processes (``retrysafe.contrib.rq.Worker``, a forked work-horse per
job), a real Redis and SIGKILLed workers and work-horses: each job's effect happens once, none
is lost, and a job enqueued twice with one key is answered with the first one's result."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from .conftest import services
from .crash import Plan, Setup, running
from .queues import (
    QueueWorker,
    check_control,
    check_recovered,
    rq_result,
    short_plan,
)

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(120)
def test_a_job_enqueued_twice_with_one_key_runs_once(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    services(request, "redis")
    from redis import Redis
    from rq import Queue, Retry

    from retrysafe.contrib.rq import idempotency_key

    setup = Setup(Plan("rq", "redis", "sqlite", work=1.0), tmp_path)
    workers = [QueueWorker(setup, i) for i in range(2)]
    connection = Redis.from_url(setup.broker)
    try:
        queue = Queue(setup.queue, connection=connection)
        ids = [f"{setup.queue}-{n}" for n in range(2)]
        key = idempotency_key(f"order-{uuid.uuid4().hex}")
        for job_id in ids:  # both at once: the second meets the first still running
            queue.enqueue(
                "tests.tasks.rq_app.charge",
                "o-1",
                100,
                job_id=job_id,
                retry=Retry(max=1),
                result_ttl=60,
                **key,
            )
        deadline = time.monotonic() + 60
        results = [None, None]
        while None in results and time.monotonic() < deadline:
            results = [rq_result(connection, job_id) for job_id in ids]
            time.sleep(0.2)
        assert results[0] == results[1] == {"order_id": "o-1", "amount": 100}
        assert [key for key, _ in setup.rows()] == ["o-1"]
        assert setup.count("executed") == 1
        assert setup.count("replayed") == 1
    finally:
        for worker in workers:
            worker.stop()
        connection.close()
        setup.drop()


@pytest.mark.timeout(120)
def test_a_killed_job_comes_back_while_no_other_job_comes(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The last job's worker SIGKILLed mid-run, and nothing else enqueued: the idle worker runs
    its maintenance every interval (RQ's own would first wait up to 405 s for a job), finds the
    dead execution and runs the job again, once."""
    services(request, "redis", "postgres")
    from redis import Redis
    from rq import Queue, Retry

    setup = Setup(Plan("rq", "redis", "postgres", work=3.0), tmp_path)
    workers = [QueueWorker(setup, i) for i in range(2)]
    connection = Redis.from_url(setup.broker)
    try:
        queue = Queue(setup.queue, connection=connection)
        job_id = f"{setup.queue}-1"
        queue.enqueue("tests.tasks.rq_app.charge", "o-1", 100, job_id=job_id, retry=Retry(max=3))
        victim = running(setup, workers)
        assert victim is not None, "the job never started"
        victim.kill()
        killed = time.monotonic()
        deadline = killed + 60
        while rq_result(connection, job_id) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert rq_result(connection, job_id) == {"order_id": "o-1", "amount": 100}
        assert time.monotonic() - killed < 40
        assert [key for key, _ in setup.rows()] == ["o-1"]
        # two runs started (``executed`` is sent as a run starts): the killed one, and the
        # retry that took the dead run's key over
        assert setup.count("executed") == 2
    finally:
        for worker in workers:
            worker.stop()
        connection.close()
        setup.drop()


@pytest.mark.timeout(300)
def test_each_job_runs_once_across_killed_workers(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A worker and its work-horse SIGKILLed mid-run: RQ retries the job (``Retry(max=3)``)
    once the dead execution's heartbeat expires, and it runs once."""
    services(request, "redis", "postgres")
    check_recovered(short_plan("rq"), tmp_path, recovery=8)


@pytest.mark.timeout(120)
def test_the_control_without_retrysafe_runs_duplicates(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The same run with a plain RQ job: the producer's second copies run again."""
    services(request, "redis", "postgres")
    check_control("rq", tmp_path)


def test_the_checks_name_what_loses_or_repeats_a_job(redis_url: str) -> None:
    from redis import Redis
    from rq import Queue, Retry
    from rq import Worker as RQWorker

    from retrysafe import IdempotencyConfig
    from retrysafe.contrib.rq import Worker, check_job, check_worker

    connection = Redis.from_url(redis_url)
    queue = Queue(f"tasks_check_{uuid.uuid4().hex[:8]}", connection=connection)
    try:
        plain = RQWorker([queue], connection=connection)
        ours = Worker([queue], connection=connection, maintenance_interval=5)
        assert any("--maintenance-interval 5" in m for m in check_worker(plain))
        assert any("retrysafe.contrib.rq.Worker" in m for m in check_worker(plain))
        assert check_worker(ours) == []
        job = queue.enqueue("tests.tasks.rq_app.charge", "o-1", 1, job_id=f"{queue.name}-a")
        retried = queue.enqueue(
            "tests.tasks.rq_app.charge", "o-1", 1, retry=Retry(max=3), job_id=f"{queue.name}-b"
        )
        long_ttl = IdempotencyConfig(ttl=3600, lease=10)
        assert any("Retry(max=3)" in m for m in check_job(job, long_ttl, ours))
        assert check_job(retried, long_ttl, ours) == []
        short = IdempotencyConfig(ttl=20, lease=10)
        assert any("ttl (20 s)" in m for m in check_job(retried, short, ours))
        assert check_job(retried, short, None) == []
    finally:
        queue.delete(delete_jobs=True)
        connection.close()
