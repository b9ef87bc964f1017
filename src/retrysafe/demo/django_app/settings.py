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

from ... import ConfigurationError
from ...stores.sqlite import DEFAULT_BUSY_TIMEOUT, busy_timeout_option, parse_sqlite_url
from ..domain import DEFAULT_STORE, default_db_url, same_database

ORDERHUB_STORE = os.environ.get("RETRYSAFE_DEMO_STORE", DEFAULT_STORE)
ORDERHUB_DB = os.environ.get("RETRYSAFE_DEMO_DB") or default_db_url(ORDERHUB_STORE)


def database(url: str) -> dict[str, Any]:
    """``DATABASES["default"]`` for a ``sqlite:///``, ``postgresql://`` or ``mysql://`` URL
    (MySQL and MariaDB through PyMySQL, the driver of ``retrysafe[mysql]``, standing in for
    mysqlclient)."""
    if url.startswith("sqlite:///"):
        path, options = parse_sqlite_url(url)
        busy = busy_timeout_option(options)
        # Deferred transactions (Django's default), not IMMEDIATE: the view's atomic block
        # begins before the view runs, and an IMMEDIATE one would hold SQLite's single write
        # lock for the whole view, so a duplicate could not even be told "in progress". The
        # views write before they read, so the lock is taken by the first INSERT (waiting up to
        # the same bound as every OrderHub: ?busy_timeout= or 30 s) and held until the record
        # commits.
        timeout = DEFAULT_BUSY_TIMEOUT if busy is None else busy
        sqlite = {"timeout": timeout, "init_command": "PRAGMA journal_mode=WAL;"}
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": path, "OPTIONS": sqlite}
    parts = urlsplit(url)
    if parts.scheme in ("mysql", "mariadb"):
        try:
            import pymysql
        except ImportError as exc:
            raise ConfigurationError(
                "OrderHub on MySQL needs PyMySQL: pip install 'retrysafe[mysql]'"
            ) from exc
        pymysql.install_as_MySQLdb()
        engine, options = "django.db.backends.mysql", {"charset": "utf8mb4"}
    else:
        # libpq options in the query (e.g. options=-csearch_path=orderhub) go to the driver;
        # store options (table=...) do not.
        engine = "django.db.backends.postgresql"
        options = {k: v for k, v in parse_qsl(parts.query) if k in ("options", "sslmode")}
    return {
        "ENGINE": engine,
        "OPTIONS": options,
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


SAME_DATABASE = same_database(ORDERHUB_STORE, ORDERHUB_DB)

SECRET_KEY = os.environ.get("RETRYSAFE_DEMO_SECRET", "orderhub-demo-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "retrysafe.demo.django_app.urls"
USE_TZ = True
INSTALLED_APPS = ["retrysafe.contrib.django", "retrysafe.demo.django_app"]
MIDDLEWARE = [
    "retrysafe.demo.django_app.views.ProblemMiddleware",
    "retrysafe.contrib.django.IdempotencyMiddleware",
]
# The store's database when the store is SQL (transactional), else the orders' own file.
DATABASES = {"default": database(ORDERHUB_DB)}
RETRYSAFE = {
    "STORE": "django" if SAME_DATABASE else ORDERHUB_STORE,
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
