"""Settings of the Django test project (only tests/django uses them: its conftest sets
DJANGO_SETTINGS_MODULE). Two databases: SQLite (``default``) and PostgreSQL (``pg``), each with a
run-unique test database."""

from __future__ import annotations

import os
import tempfile
from urllib.parse import unquote, urlsplit

from tests.conftest import POSTGRES_URL, RUN_ID

_PG = urlsplit(POSTGRES_URL)
TMP = os.path.join(tempfile.gettempdir(), f"retrysafe-django-{RUN_ID}")
os.makedirs(TMP, exist_ok=True)

SECRET_KEY = "tests-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "tests.django.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "rest_framework",
    "retrysafe.contrib.django",
    "retrysafe.demo.django_app",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "tests.django.views.ReadPostMiddleware",
    "retrysafe.contrib.django.IdempotencyMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(TMP, "default.db"),
        "OPTIONS": {"timeout": 20},
        "TEST": {"NAME": os.path.join(TMP, "test-default.db")},
    },
    "pg": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(_PG.path.lstrip("/")) or "test",
        "USER": unquote(_PG.username or "postgres"),
        "PASSWORD": unquote(_PG.password or ""),
        "HOST": _PG.hostname or "127.0.0.1",
        "PORT": str(_PG.port or 5432),
        "TEST": {"NAME": f"test_rs_django_{RUN_ID}", "DEPENDENCIES": []},
    },
}
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
}
RETRYSAFE = {"STORE": "memory://"}
