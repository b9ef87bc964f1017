"""Testing task queues as a user's suite does: a store per test, Celery's eager mode, and the
switch (``idempotency_disabled()``, the ``retrysafe_disabled`` fixture) turning ``@idempotent_task``
and Dramatiq's ``idempotent=`` off on the paths a test sends through (``.delay()``, ``.apply()``,
a worker)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from retrysafe.stores import MemoryStore
from retrysafe.testing import idempotency_disabled

celery_contrib = pytest.importorskip("retrysafe.contrib.celery")
dramatiq_contrib = pytest.importorskip("retrysafe.contrib.dramatiq")


@pytest.fixture
def eager(retrysafe_store: MemoryStore) -> Iterator[tuple[Any, list[str]]]:
    """A Celery app in eager mode whose keyed task runs on this test's store."""
    from celery import Celery

    app = Celery("testing_tasks", broker="memory://")
    app.conf.task_always_eager = True
    charges: list[str] = []

    @app.task(name="testing_tasks.charge")
    @celery_contrib.idempotent_task(store=retrysafe_store, key="order_id")
    def charge(order_id: str, amount: int) -> dict[str, Any]:
        charges.append(order_id)
        return {"order_id": order_id, "amount": amount}

    yield charge, charges


def _send_four_times(charge: Any) -> None:
    charge.delay("o-1", 100)
    charge.delay("o-1", 100, idempotency_key="k-1")
    charge.apply(("o-1", 100), **celery_contrib.idempotency_key("k-1"))
    charge.apply(("o-1", 100))


def test_eager_tasks_run_once_per_key(eager: Any) -> None:
    charge, charges = eager
    _send_four_times(charge)
    assert charges == ["o-1", "o-1"]  # key o-1 (from the argument) and k-1


def test_the_disabled_block_turns_eager_tasks_off(eager: Any) -> None:
    charge, charges = eager
    with idempotency_disabled():
        _send_four_times(charge)
        assert charge.delay("o-1", 100).get() == {"order_id": "o-1", "amount": 100}
    assert charges == ["o-1"] * 5
    charge.delay("o-1", 100)
    assert len(charges) == 6  # back on: the first keyed run since the block
    charge.delay("o-1", 100)
    assert len(charges) == 6


@pytest.mark.usefixtures("retrysafe_disabled")
def test_the_disabled_fixture_turns_eager_tasks_off(eager: Any) -> None:
    charge, charges = eager
    _send_four_times(charge)
    assert charges == ["o-1"] * 4


def test_the_disabled_block_turns_dramatiq_actors_off(retrysafe_store: MemoryStore) -> None:
    import dramatiq
    from dramatiq.brokers.stub import StubBroker

    broker = StubBroker()
    broker.add_middleware(dramatiq_contrib.Idempotency(store=retrysafe_store))
    charges: list[str] = []

    @dramatiq.actor(broker=broker, actor_name="testing_charge", idempotent={"key": "order_id"})
    def charge(order_id: str) -> None:
        charges.append(order_id)

    worker = dramatiq.Worker(broker, worker_timeout=50)
    worker.start()
    try:
        with idempotency_disabled():
            charge.send("o-1")
            charge.send("o-1")
            broker.join(charge.queue_name)
            worker.join()
        assert charges == ["o-1", "o-1"]
        charge.send("o-1")
        charge.send("o-1")
        broker.join(charge.queue_name)
        worker.join()
        assert charges == ["o-1", "o-1", "o-1"]
    finally:
        worker.stop()
        broker.close()
