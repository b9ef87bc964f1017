"""``make chaos-tasks``: the long crash runs. 2-3 workers, ``acks_late=True``,
``task_reject_on_worker_lost=True``, a 1 s visibility timeout on the Redis broker, 300 tasks with
business keys (20% sent twice by the producer), 10 SIGKILLs at random points: every key's effect
exactly once, none lost, every second copy answered from the stored result; the same run with a
plain Celery task (the control) shows the duplicates. Each run's line goes to
``test-artifacts/tasks-chaos.txt``. Dramatiq: the same crash run, shorter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .conftest import services
from .crash import Outcome, Plan, crash_run
from .test_celery import excused

pytestmark = [pytest.mark.chaos, pytest.mark.e2e, pytest.mark.timeout(900)]

TASKS = int(os.environ.get("CHAOS_TASKS", "300"))
KILLS = int(os.environ.get("CHAOS_KILLS", "10"))


def _report(outcome: Outcome) -> None:
    line = outcome.line()
    print(line)
    Path("test-artifacts").mkdir(exist_ok=True)
    with open("test-artifacts/tasks-chaos.txt", "a") as out:
        out.write(line + "\n")


CELERY = [
    pytest.param(broker, store, id=f"{broker}-broker-{store}")
    for broker in ("redis", "rabbitmq")
    for store in ("sqlite", "postgres", "redis")
] + [pytest.param("redis", "django", id="redis-broker-django-postgres")]


@pytest.mark.parametrize(("broker", "store"), CELERY)
def test_celery_chaos(
    broker: str, store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    services(request, broker, store, "postgres")
    plan = Plan("celery", broker, store, tasks=TASKS, kills=KILLS, workers=3)
    outcome = crash_run(plan, tmp_path)
    _report(outcome)
    check_outcome(outcome)


def check_outcome(outcome: Outcome) -> None:
    assert outcome.lost - excused(outcome) == 0, outcome.line()
    if outcome.plan.store == "redis":
        assert outcome.duplicates <= outcome.kills, outcome.line()
    else:
        assert outcome.duplicates == 0, outcome.line()
    assert outcome.replays + outcome.unknown >= outcome.sends - outcome.plan.tasks, outcome.line()


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_celery_control_without_retrysafe(
    broker: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    services(request, broker, "postgres")
    plan = Plan("celery", broker, "none", tasks=TASKS, kills=KILLS, workers=3)
    outcome = crash_run(plan, tmp_path)
    _report(outcome)
    assert outcome.duplicates >= outcome.sends - TASKS > 0


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_dramatiq_chaos(broker: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    services(request, broker, "postgres")
    plan = Plan("dramatiq", broker, "postgres", tasks=TASKS // 2, kills=KILLS // 2, workers=2)
    outcome = crash_run(plan, tmp_path)
    _report(outcome)
    check_outcome(outcome)
