"""The Dramatiq app the task tests run in real ``dramatiq`` worker processes, configured by the
environment variables of :mod:`tests.tasks.celery_app` (``TASKS_BROKER`` names a Redis or a
RabbitMQ broker)."""

from __future__ import annotations

import os

import dramatiq

from retrysafe.contrib.dramatiq import Idempotency

from .effects import BROKER, MODE, QUEUE, STORE, effect, event, work

if BROKER.startswith("redis"):
    from dramatiq.brokers.redis import RedisBroker

    # A dead worker's messages come back after 3 s without its heartbeat (default 60 s), and
    # every fetch may look for them (default: one in a thousand).
    broker: dramatiq.Broker = RedisBroker(
        url=BROKER,
        namespace=os.environ.get("TASKS_PREFIX", "tasks_").rstrip(":"),
        heartbeat_timeout=3000,
        maintenance_chance=100_000,
    )
else:
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    broker = RabbitmqBroker(url=BROKER)

if STORE != "none":
    broker.add_middleware(
        Idempotency(store=STORE, transactional=MODE in ("tx", "django"), lease=10, on_event=event)
    )
dramatiq.set_broker(broker)


@dramatiq.actor(
    actor_name="tasks_charge",
    queue_name=QUEUE,
    **({} if STORE == "none" else {"idempotent": {"key": "order_id"}}),
)
def charge(order_id: str, amount: int) -> None:
    work()
    effect(order_id)
