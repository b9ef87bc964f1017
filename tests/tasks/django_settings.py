"""Django settings of the task tests' same-transaction mode (``TASKS_MODE=django``): the ORM
store's records and the task's effects in one PostgreSQL schema of the run's own
(``TASKS_DJANGO_SCHEMA``), written in one transaction."""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

_PG = urlsplit(os.environ.get("TASKS_EFFECTS", "postgresql://postgres@127.0.0.1:5432/test"))
SCHEMA = os.environ.get("TASKS_DJANGO_SCHEMA", "tasks_django")

SECRET_KEY = "tests-only"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["retrysafe.contrib.django"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _PG.path.lstrip("/") or "test",
        "USER": unquote(_PG.username or "postgres"),
        "PASSWORD": unquote(_PG.password or ""),
        "HOST": _PG.hostname or "127.0.0.1",
        "PORT": str(_PG.port or 5432),
        "OPTIONS": {"options": f"-c search_path={SCHEMA}"},
    }
}


def record_effect(table: str, key: str, at: float) -> None:
    """The task's effect on Django's connection: inside the task's atomic block, so it commits
    with the task's record or not at all."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (key, pid, at) VALUES (%s, %s, %s)", (key, os.getpid(), at)
        )


# A project that uses retrysafe for its tasks only has no middleware to add.
SILENCED_SYSTEM_CHECKS = ["retrysafe.W001"]
