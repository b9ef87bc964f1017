"""The Huey task the task tests run in a real ``huey_consumer`` process, configured by the
environment variables of :mod:`tests.tasks.celery_app` (``TASKS_STORE=none``: a plain Huey
task, the control). Each task a consumer starts is logged (``received``, by a ``pre_execute``
hook) before retrysafe sees it."""

from __future__ import annotations

from typing import Any

from huey import RedisHuey

from retrysafe.contrib.huey import idempotent_task

from .effects import BROKER, EVENTS, MODE, QUEUE, STORE, effect, event, work

huey = RedisHuey(QUEUE, url=BROKER)


def _charge(order_id: str, amount: int) -> dict[str, Any]:
    work()
    effect(order_id)
    return {"order_id": order_id, "amount": amount}


if STORE == "none":
    charge = huey.task(name="tasks_charge")(_charge)
else:
    charge = huey.task(name="tasks_charge")(
        idempotent_task(
            huey,
            store=STORE,
            key="order_id",
            name="tasks_charge",
            transactional=MODE in ("tx", "django"),
            lease=10,
            on_event=event,
        )(_charge)
    )


@huey.pre_execute()
def _received(task: Any) -> None:
    with open(EVENTS, "a") as out:
        out.write(f"received {task.args[0]}\n")
