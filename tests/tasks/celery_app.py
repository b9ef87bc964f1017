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
- ``TASKS_EVENTS``: a file each delivery's outcome is appended to (``executed``, ``replayed``).
"""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

from celery import Celery

from retrysafe import functions
from retrysafe.contrib.celery import idempotent_task

BROKER = os.environ.get("TASKS_BROKER", "redis://127.0.0.1:6379/0")
QUEUE = os.environ.get("TASKS_QUEUE", "tasks_default")
STORE = os.environ.get("TASKS_STORE", "none")
MODE = os.environ.get("TASKS_MODE", "plain")
TABLE = os.environ.get("TASKS_TABLE", "tasks_effects")
EFFECTS = os.environ.get("TASKS_EFFECTS", "postgresql://postgres@127.0.0.1:5432/test")
EVENTS = os.environ.get("TASKS_EVENTS", os.devnull)
WORK = float(os.environ.get("TASKS_WORK", "0.2"))

if MODE == "django":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.tasks.django_settings")
    import django

    django.setup()

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
    },
    worker_hijack_root_logger=False,
    task_time_limit=30,
)

_local = threading.local()


def _effects_connection() -> Any:
    import psycopg

    if getattr(_local, "pid", None) != os.getpid():
        _local.conn = psycopg.connect(EFFECTS, autocommit=True)
        _local.pid = os.getpid()
    return _local.conn


def _event(event: str, details: dict[str, Any]) -> None:
    if event in ("executed", "replayed"):
        with open(EVENTS, "a") as out:
            out.write(f"{event}\n")


def _work() -> None:
    """The task's own time: long enough that kills land inside runs."""
    time.sleep(random.uniform(0, 2 * WORK))


def _effect(order_id: str) -> None:
    now = time.time()
    if MODE == "tx":
        conn = functions.transaction()
        # sqlite3's placeholders, or the PostgreSQL store's raw psycopg connection's ($n)
        marks = "?, ?, ?" if type(conn).__module__ == "sqlite3" else "$1, $2, $3"
        conn.execute(f"INSERT INTO {TABLE} (key, pid, at) VALUES ({marks})", (order_id, os.getpid(), now))
    elif MODE == "django":
        from tests.tasks.django_settings import record_effect

        record_effect(TABLE, order_id, now)
    else:
        _effects_connection().execute(
            f"INSERT INTO {TABLE} (key, pid, at) VALUES (%s, %s, %s)",
            (order_id, os.getpid(), now),
        )
        if MODE == "commit":
            functions.mark_committed()


if STORE == "none":

    @app.task(name="tasks.charge")
    def charge(order_id: str, amount: int) -> dict[str, Any]:
        _work()
        _effect(order_id)
        return {"order_id": order_id, "amount": amount}

else:

    @app.task(name="tasks.charge")
    @idempotent_task(
        store=STORE,
        key="order_id",
        name="tasks.charge",
        transactional=MODE in ("tx", "django"),
        lease=10,
        on_event=_event,
    )
    def charge(order_id: str, amount: int) -> dict[str, Any]:
        _work()
        _effect(order_id)
        return {"order_id": order_id, "amount": amount}
