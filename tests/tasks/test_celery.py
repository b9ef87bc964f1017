"""Celery with real ``celery worker`` processes (prefork), real Redis and RabbitMQ brokers and
SIGKILLed workers: each task's effect happens once, none is lost, and the copies a producer sent
twice are answered from the stored result. The short runs of ``make test``; ``make chaos-tasks``
runs the long ones (``test_chaos.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import services
from .crash import Outcome, Plan, crash_run

pytestmark = pytest.mark.e2e


def excused(outcome: Outcome) -> int:
    """Lost keys that are the broker's: on Celery's Redis transport a message is taken off the
    list before it is recorded as unacknowledged (celery/celery#7950), and a worker killed in
    between loses it before any task starts. A key no worker ever started is that; a key a
    worker started and nobody finished is retrysafe's and never excused."""
    return outcome.undelivered if outcome.plan.broker == "redis" else 0


def check(outcome_plan: Plan, tmp_path: Path) -> None:
    outcome = crash_run(outcome_plan, tmp_path)
    print(outcome.line())
    assert outcome.lost - excused(outcome) == 0, outcome.line()
    if outcome_plan.store == "redis":
        # The effect's database is not the store's: a kill between the effect's commit and
        # mark_committed() (one round trip) runs it again; never more than once per kill.
        assert outcome.duplicates <= outcome.kills, outcome.line()
    else:
        assert outcome.duplicates == 0, outcome.line()
    # Every copy the producer sent again was answered from the stored result, not run.
    assert outcome.replays + outcome.unknown >= outcome.sends - outcome_plan.tasks, outcome.line()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("broker", "store"),
    [("redis", "postgres"), ("rabbitmq", "redis")],
    ids=["redis-broker-postgres", "rabbitmq-broker-redis"],
)
def test_each_task_runs_once_across_killed_workers(
    broker: str, store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    services(request, broker, store, "postgres")
    check(Plan("celery", broker, store, tasks=20, kills=1, workers=2, work=0.1), tmp_path)


@pytest.mark.timeout(120)
def test_the_control_without_retrysafe_runs_duplicates(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The same run with a plain Celery task: the producer's second copies run again."""
    services(request, "redis", "postgres")
    outcome = crash_run(Plan("celery", "redis", "none", tasks=20, kills=0, workers=1), tmp_path)
    print(outcome.line())
    assert outcome.duplicates >= outcome.sends - 20 > 0
