"""``make chaos-tasks`` on RQ, arq, taskiq and Huey: the long crash run (CHAOS_TASKS tasks, 20%
sent twice, CHAOS_KILLS SIGKILLs of a whole worker and its children) with retrysafe, and the same
run with a plain job and with the queue's own job-id deduplication (the controls; Huey has none).
Each run's line goes to ``test-artifacts/tasks-chaos.txt``. Huey has no redelivery: a killed
consumer's tasks come back through retrysafe's running entries and heartbeats (a live consumer
enqueues them again once the dead one's heartbeat lapses)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import services
from .crash import Plan
from .queues import crash_run
from .test_chaos import KILLS, TASKS, _report, check_outcome

pytestmark = [pytest.mark.chaos, pytest.mark.e2e, pytest.mark.timeout(900)]


@pytest.mark.parametrize("queue", ["rq", "arq", "taskiq", "huey"])
def test_queue_chaos(queue: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    services(request, "redis", "postgres")
    outcome = crash_run(Plan(queue, "redis", "postgres", tasks=TASKS, kills=KILLS), tmp_path)
    _report(outcome)
    check_outcome(outcome)


@pytest.mark.parametrize("queue", ["rq", "arq", "taskiq", "huey"])
def test_queue_control_without_retrysafe(
    queue: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    services(request, "redis", "postgres")
    outcome = crash_run(Plan(queue, "redis", "none", tasks=TASKS, kills=KILLS), tmp_path)
    _report(outcome)
    if queue == "huey":
        # No redelivery: a kill loses what it cut, some second copies with it (reported).
        assert outcome.duplicates > 0, outcome.line()
    else:
        assert outcome.duplicates >= outcome.sends - TASKS > 0


@pytest.mark.parametrize("queue", ["rq", "arq"])
def test_queue_control_with_its_own_deduplication(
    queue: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job id is the business key (RQ ``job_id=``, arq ``_job_id``): what each queue offers
    instead. Reported, not asserted: the figures are the point."""
    services(request, "redis", "postgres")
    from . import queues

    monkeypatch.setattr(queues, "OWN_DEDUP", True)
    outcome = crash_run(Plan(queue, "redis", "none", tasks=TASKS, kills=KILLS), tmp_path)
    _report(outcome)
