"""``python -m tests.tasks.on_commit``: Celery's ``delay_on_commit`` (Django) with the key as a
keyword argument; prints the runs as JSON. Run by test_keys.py in a process of its own (Django
configured with tests/tasks/django_settings.py)."""

from __future__ import annotations

import json
import os
import time

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.tasks.django_settings"

import django

django.setup()

from celery import Celery  # noqa: E402
from celery.contrib.testing.worker import start_worker  # noqa: E402
from django.db import transaction  # noqa: E402

from retrysafe.contrib.celery import idempotent_task  # noqa: E402

app = Celery(
    "tasks_on_commit", broker="memory://", task_cls="celery.contrib.django.task:DjangoTask"
)
runs: list[str] = []


@app.task(name="tasks_on_commit.charge")
@idempotent_task(store="memory://")
def charge(order_id: str) -> str:
    runs.append(order_id)
    return order_id


with start_worker(app, perform_ping_check=False, shutdown_timeout=10):
    with transaction.atomic():
        charge.delay_on_commit("o-1", idempotency_key="order-1")
        charge.delay_on_commit("o-1", idempotency_key="order-1")  # the view ran twice
    try:
        with transaction.atomic():
            charge.delay_on_commit("o-2", idempotency_key="order-2")
            raise RuntimeError("rolled back")
    except RuntimeError:
        pass
    deadline = time.monotonic() + 10
    while not runs and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
print(json.dumps(runs))
