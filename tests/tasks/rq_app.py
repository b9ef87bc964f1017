"""The RQ job the task tests run in real ``rq worker`` processes (``retrysafe.contrib.rq.Worker``,
forking a work-horse per job), configured by the environment variables of
:mod:`tests.tasks.celery_app` (``TASKS_STORE=none``: a plain RQ job, the control)."""

from __future__ import annotations

from typing import Any

from retrysafe.contrib.rq import idempotent_job

from .effects import MODE, STORE, effect, event, work


def _charge(order_id: str, amount: int) -> dict[str, Any]:
    work()
    effect(order_id)
    return {"order_id": order_id, "amount": amount}


if STORE == "none":
    charge = _charge
else:
    charge = idempotent_job(
        _charge,
        store=STORE,
        key="order_id",
        name="tasks_charge",
        transactional=MODE in ("tx", "django"),
        lease=10,
        on_event=event,
    )
