"""arq with real ``arq`` worker processes, a real Redis and SIGKILLed workers: each job's effect
happens once, none is lost (arq runs a killed worker's job again once its in-progress key
expires), and a job enqueued twice with one key is answered with the first one's result."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from .conftest import services
from .crash import Plan, Setup
from .queues import QueueWorker, check_control, check_recovered, short_plan

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(120)
def test_a_job_enqueued_twice_with_one_key_runs_once(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    services(request, "redis")
    from arq import create_pool
    from arq.connections import RedisSettings

    setup = Setup(Plan("arq", "redis", "sqlite", work=1.0), tmp_path)
    worker = QueueWorker(setup, 0)
    key = f"order-{uuid.uuid4().hex}"

    async def send_twice() -> list[object]:
        pool = await create_pool(RedisSettings.from_dsn(setup.broker))
        try:
            jobs = [
                await pool.enqueue_job(
                    "charge",
                    "o-1",
                    100,
                    idempotency_key=key,
                    _job_id=f"{setup.queue}-{n}",
                    _queue_name=setup.queue,
                )
                for n in range(2)
            ]
            return [await job.result(timeout=60, poll_delay=0.2) for job in jobs if job]
        finally:
            await pool.aclose()

    try:
        results = asyncio.run(send_twice())
        assert results == [{"order_id": "o-1", "amount": 100}] * 2
        assert [k for k, _ in setup.rows()] == ["o-1"]
        assert (setup.count("executed"), setup.count("replayed")) == (1, 1)
    finally:
        worker.stop()
        setup.drop()


@pytest.mark.timeout(300)
def test_each_job_runs_once_across_killed_workers(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A worker SIGKILLed mid-run: arq runs its jobs again after their in-progress key expires
    (job_timeout 5 s + 10 s), and each runs once."""
    services(request, "redis", "postgres")
    check_recovered(short_plan("arq"), tmp_path, recovery=8)


@pytest.mark.timeout(120)
def test_the_control_without_retrysafe_runs_duplicates(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The same run with a plain arq job: the producer's second copies run again."""
    services(request, "redis", "postgres")
    check_control("arq", tmp_path)


def test_the_check_names_what_loses_or_repeats_a_job() -> None:
    from arq.worker import func

    from retrysafe.contrib.arq import check_at_startup, check_worker, idempotent_job

    @idempotent_job(store="memory://", ttl=3600)
    async def kept(ctx: dict[str, object], order_id: str) -> str:
        return order_id

    @idempotent_job(store="memory://", ttl=60)
    async def short(ctx: dict[str, object], order_id: str) -> str:
        return order_id

    async def plain(ctx: dict[str, object]) -> None:
        return None

    assert check_worker({"functions": [kept, plain], "job_timeout": 60}) == []
    once = check_worker({"functions": [func(kept, max_tries=1)]})
    assert len(once) == 1 and "max_tries is 1" in once[0]
    (ttl,) = check_worker({"functions": [short], "job_timeout": 60})
    assert "ttl (60 s)" in ttl and "70 s" in ttl

    class Settings:
        functions = [short]

    checked = check_at_startup(Settings)
    with pytest.warns(RuntimeWarning, match="ttl"):
        asyncio.run(checked.on_startup({}))  # type: ignore[attr-defined]
