"""The effect every task test's task has, shared by the Celery and the Dramatiq apps (see
:mod:`tests.tasks.celery_app` for the environment variables)."""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

from retrysafe import functions

STORE = os.environ.get("TASKS_STORE", "none")
MODE = os.environ.get("TASKS_MODE", "plain")
TABLE = os.environ.get("TASKS_TABLE", "tasks_effects")
EFFECTS = os.environ.get("TASKS_EFFECTS", "postgresql://postgres@127.0.0.1:5432/test")
EVENTS = os.environ.get("TASKS_EVENTS", os.devnull)
WORK = float(os.environ.get("TASKS_WORK", "0.2"))
QUEUE = os.environ.get("TASKS_QUEUE", "tasks_default")
BROKER = os.environ.get("TASKS_BROKER", "redis://127.0.0.1:6379/0")

if MODE == "django":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.tasks.django_settings")
    import django

    django.setup()

_local = threading.local()


def effects_connection() -> Any:
    import psycopg

    if getattr(_local, "pid", None) != os.getpid():
        _local.conn = psycopg.connect(EFFECTS, autocommit=True)
        _local.pid = os.getpid()
    return _local.conn


def event(event: str, details: dict[str, Any]) -> None:
    if event in ("executed", "replayed", "outcome_unknown"):
        with open(EVENTS, "a") as out:
            out.write(f"{event} {details.get('record', '-')}\n")


def working() -> None:
    """Log that this process runs a job now (``working <pid>``): a run whose kill is aimed
    (``Plan.aimed``) kills the worker this process belongs to."""
    with open(EVENTS, "a") as out:
        out.write(f"working {os.getpid()}\n")


def work() -> None:
    """The task's own time: long enough that kills land inside runs."""
    working()
    time.sleep(random.uniform(0, 2 * WORK))


def effect(order_id: str) -> None:
    now = time.time()
    if MODE == "tx":
        conn = functions.transaction()
        # sqlite3's placeholders, or psycopg's (the PostgreSQL store's sync connection)
        marks = "?, ?, ?" if type(conn).__module__ == "sqlite3" else "%s, %s, %s"
        conn.execute(
            f"INSERT INTO {TABLE} (key, pid, at) VALUES ({marks})", (order_id, os.getpid(), now)
        )
    elif MODE == "django":
        from tests.tasks.django_settings import record_effect

        record_effect(TABLE, order_id, now)
    else:
        effects_connection().execute(
            f"INSERT INTO {TABLE} (key, pid, at) VALUES (%s, %s, %s)",
            (order_id, os.getpid(), now),
        )
        if MODE == "commit":
            functions.mark_committed()
