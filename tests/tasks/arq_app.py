"""The arq job the task tests run in real ``arq`` worker processes, configured by the environment
variables of :mod:`tests.tasks.celery_app` (``TASKS_STORE=none``: a plain arq job, the control).
The effect is written on the job's transaction (``tx``: the SQLite or PostgreSQL store's own
connection, ``asyncpg`` for PostgreSQL) or, for the control, as a plain PostgreSQL row."""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Any

from arq.connections import RedisSettings

import retrysafe
from retrysafe.contrib.arq import check_at_startup, idempotent_job

from .effects import BROKER, MODE, QUEUE, STORE, TABLE, WORK, effects_connection, event


async def charge(ctx: dict[str, Any], order_id: str, amount: int) -> dict[str, Any]:
    await asyncio.sleep(random.uniform(0, 2 * WORK))
    now = time.time()
    if MODE == "tx":
        conn = await retrysafe.transaction()
        if type(conn).__module__ == "sqlite3":
            conn.execute(f"INSERT INTO {TABLE} VALUES (?, ?, ?)", (order_id, os.getpid(), now))
        else:
            await conn.execute(
                f"INSERT INTO {TABLE} VALUES ($1, $2, $3)", order_id, os.getpid(), now
            )
    else:
        effects_connection().execute(
            f"INSERT INTO {TABLE} VALUES (%s, %s, %s)", (order_id, os.getpid(), now)
        )
    return {"order_id": order_id, "amount": amount}


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
