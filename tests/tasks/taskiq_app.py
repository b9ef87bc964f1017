"""The taskiq task the task tests run in real ``taskiq worker`` processes on the Redis stream
broker (acknowledged after the result is saved, redelivered after 5 s unacknowledged),
configured by the environment variables of :mod:`tests.tasks.celery_app` (``TASKS_STORE=none``:
a plain taskiq task, the control)."""

from __future__ import annotations

from typing import Any

from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

from retrysafe.contrib.taskiq import Idempotency, idempotent_task

from . import aeffects
from .effects import BROKER, QUEUE, STORE, event

broker = RedisStreamBroker(
    BROKER, queue_name=QUEUE, consumer_group_name=QUEUE, idle_timeout=5000, xread_block=500
).with_result_backend(RedisAsyncResultBackend(BROKER, result_ex_time=120, prefix_str=QUEUE))
broker.add_middlewares(Idempotency())


async def _charge(order_id: str, amount: int) -> dict[str, Any]:
    return await aeffects.charge(order_id, amount)


if STORE != "none":
    _charge = idempotent_task(
        _charge,
        store=STORE,
        key="order_id",
        name="tasks_charge",
        lease=10,
        on_event=event,
        transactional=True,
    )
charge = broker.task(task_name="tasks_charge")(_charge)


@broker.task(task_name="tasks_tick")
async def tick() -> None:
    """Traffic: taskiq-redis's stream broker looks for a dead worker's unacknowledged messages
    only after it read a new one."""
