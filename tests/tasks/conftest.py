"""The task tests' services: the brokers and stores a crash run names, skipped on a laptop
without them and failing under CI=true."""

from __future__ import annotations

import pytest


def services(request: pytest.FixtureRequest, *names: str) -> None:
    """Require the real services a run uses (``redis``, ``postgres``, ``rabbitmq``)."""
    fixtures = {"redis": "redis_url", "postgres": "postgres_url", "rabbitmq": "rabbitmq_url"}
    for name in names:
        if name in fixtures:
            request.getfixturevalue(fixtures[name])
