"""Dramatiq with real ``dramatiq`` worker processes, real Redis and RabbitMQ brokers and SIGKILLed
workers: each message's effect happens once, none is lost, and the copies a producer sent twice
are answered from the stored result."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import services
from .crash import Plan
from .test_celery import check

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("broker", "store"),
    [("redis", "sqlite"), ("rabbitmq", "postgres")],
    ids=["redis-broker-sqlite", "rabbitmq-broker-postgres"],
)
def test_each_message_runs_once_across_killed_workers(
    broker: str, store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    services(request, broker, store, "postgres")
    check(Plan("dramatiq", broker, store, tasks=20, kills=1, workers=2, work=0.1), tmp_path)
