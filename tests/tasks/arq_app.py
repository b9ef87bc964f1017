"""The arq job the task tests run in real ``arq`` worker processes, configured by the environment
variables of :mod:`tests.tasks.celery_app` (``TASKS_STORE=none``: a plain arq job, the control),
with the effect of :mod:`tests.tasks.aeffects`."""

from __future__ import annotations

import os
from typing import Any

from arq.connections import RedisSettings

from retrysafe.contrib.arq import check_at_startup, idempotent_job

from . import aeffects
from .effects import BROKER, QUEUE, STORE, event


async def charge(ctx: dict[str, Any], order_id: str, amount: int) -> dict[str, Any]:
    return await aeffects.charge(order_id, amount)


if STORE != "none":
    charge = idempotent_job(
        charge,
        store=STORE,
        key="order_id",
        name="tasks_charge",
        transactional=True,
        lease=10,
        on_event=event,
    )


@check_at_startup
class WorkerSettings:
    functions = [charge]
    redis_settings = RedisSettings.from_dsn(BROKER)
    queue_name = QUEUE
    job_timeout = 5  # a killed worker's job runs again 15 s after it started
    max_jobs = int(os.environ.get("TASKS_CONCURRENCY", "2"))
    keep_result = 120
    poll_delay = 0.2
