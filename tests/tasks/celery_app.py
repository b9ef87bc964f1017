"""The Celery app the task tests run in real ``celery worker`` processes (prefork), configured by
environment variables (set by :mod:`tests.tasks.crash`):

- ``TASKS_BROKER``: the broker URL (Redis or RabbitMQ); ``TASKS_QUEUE``: this run's queue.
- ``TASKS_VT``: the Redis broker's ``visibility_timeout`` in seconds.
- ``TASKS_STORE``: the store URL, or ``none`` for the control (a plain Celery task).
- ``TASKS_MODE``: how the effect is written: ``tx`` (a row on the call's transaction: SQLite or
  PostgreSQL store, committed with the record), ``django`` (a row through Django's ORM, same
  transaction), ``commit`` (a PostgreSQL row committed, then ``mark_committed()``: the Redis
  store) or ``plain`` (the control: a PostgreSQL row).
- ``TASKS_EFFECTS``: the PostgreSQL DSN of the effects table (``commit``, ``plain``);
  ``TASKS_TABLE``: its name.
- ``TASKS_EVENTS``: a file each delivery's start (``received``) and outcome (``executed``,
  ``replayed``) are appended to.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import task_prerun

from retrysafe.contrib.celery import idempotent_task

from .effects import BROKER, EVENTS, MODE, QUEUE, STORE, effect, event, work

app = Celery("tasks_test", broker=BROKER)
app.conf.update(
    task_default_queue=QUEUE,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    broker_transport_options={
        "visibility_timeout": float(os.environ.get("TASKS_VT", "3600")),
        "global_keyprefix": os.environ.get("TASKS_PREFIX", "tasks_"),
        # kombu sweeps for messages to restore every interval x throttle seconds (default 100 s,
        # whatever the visibility_timeout) under a mutex that a killed worker keeps for 300 s.
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
        "unacked_mutex_expire": 5,
    },
    worker_hijack_root_logger=False,
    task_time_limit=30,
)

if STORE == "none":

    @app.task(name="tasks.charge")
    def charge(order_id: str, amount: int) -> dict[str, Any]:
        work()
        effect(order_id)
        return {"order_id": order_id, "amount": amount}

else:

    @app.task(name="tasks.charge")
    @idempotent_task(
        store=STORE,
        key="order_id",
        name="tasks.charge",
        transactional=MODE in ("tx", "django"),
        lease=10,
        on_event=event,
    )
    def charge(order_id: str, amount: int) -> dict[str, Any]:
        work()
        effect(order_id)
        return {"order_id": order_id, "amount": amount}


@task_prerun.connect
def _received(args: Any = (), **_: Any) -> None:
    """Each delivery a worker starts, before retrysafe sees it: a lost key without one is a
    message the broker never handed to a task."""
    if args:
        with open(EVENTS, "a") as out:
            out.write(f"received {args[0]}\n")
