"""OrderHub's Django settings, from the environment that ``retrysafe demo --framework django``
sets (``RETRYSAFE_DEMO_STORE``, ``RETRYSAFE_DEMO_DB``, ``RETRYSAFE_DEMO_TTL``,
``RETRYSAFE_DEMO_LEASE``).

When the orders live in the store's own SQL database (the default), the store is the Django ORM
store: each order commits together with its stored response.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ...stores.sqlite import parse_sqlite_url

STORE_URL = os.environ.get("RETRYSAFE_DEMO_STORE", "sqlite:///./retrysafe-demo.db")


def _base(url: str) -> str:
    if url.startswith("sqlite:///"):
        return url.split("?", 1)[0]
    return url.replace("postgres://", "postgresql://", 1)


def _is_sql(url: str) -> bool:
    return url.startswith(("sqlite:///", "postgresql://", "postgres://"))


DB_URL = os.environ.get("RETRYSAFE_DEMO_DB") or (
    _base(STORE_URL) if _is_sql(STORE_URL) else "sqlite:///./orderhub-django.db"
)


def database(url: str) -> dict[str, Any]:
    """``DATABASES["default"]`` for a ``sqlite:///`` or ``postgresql://`` URL."""
    if url.startswith("sqlite:///"):
        path, _ = parse_sqlite_url(url)
        # Deferred transactions (Django's default), not IMMEDIATE: the view's atomic block
        # begins before the view runs, and an IMMEDIATE one would hold SQLite's single write
        # lock for the whole view, so a duplicate could not even be told "in progress". The
        # views write before they read, so the lock is taken (waiting up to the timeout) by the
        # first INSERT and held until the record commits.
        options: dict[str, Any] = {"timeout": 20, "init_command": "PRAGMA journal_mode=WAL;"}
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": path, "OPTIONS": options}
    parts = urlsplit(url)
    # libpq options in the query (e.g. options=-csearch_path=orderhub) go to the driver;
    # store options (table=...) do not.
    return {
        "ENGINE": "django.db.backends.postgresql",
        "OPTIONS": {k: v for k, v in parse_qsl(parts.query) if k in ("options", "sslmode")},
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


SAME_DATABASE = _is_sql(STORE_URL) and (
    os.path.abspath(_base(STORE_URL)[10:]) == os.path.abspath(_base(DB_URL)[10:])
    if STORE_URL.startswith("sqlite:///")
    else _base(STORE_URL) == _base(DB_URL)
)

SECRET_KEY = os.environ.get("RETRYSAFE_DEMO_SECRET", "orderhub-demo-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "retrysafe.demo.django_app.urls"
USE_TZ = True
INSTALLED_APPS = ["retrysafe.contrib.django", "retrysafe.demo.django_app"]
MIDDLEWARE = [
    "retrysafe.demo.django_app.views.FailureMiddleware",
    "retrysafe.contrib.django.IdempotencyMiddleware",
]
DATABASES = {"default": database(DB_URL)}
RETRYSAFE = {
    "STORE": "django" if SAME_DATABASE else STORE_URL,
    "TRANSACTIONAL": SAME_DATABASE,
    "TTL": float(os.environ.get("RETRYSAFE_DEMO_TTL", 24 * 3600)),
    "LEASE": float(os.environ.get("RETRYSAFE_DEMO_LEASE", 30)),
}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"retrysafe": {"handlers": ["console"], "level": "WARNING"}},
}
