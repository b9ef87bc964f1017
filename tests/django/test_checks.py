"""``manage.py check`` reports bad ``settings.RETRYSAFE`` with a clear message; the middleware
refuses to start on them."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from retrysafe.contrib.django.checks import check_settings
from retrysafe.contrib.django.middleware import IdempotencyMiddleware


def _ids(settings: Any, value: Any) -> dict[str, str]:
    settings.RETRYSAFE = value
    return {message.id: message.msg for message in check_settings()}


def test_good_settings_pass(settings: Any) -> None:
    assert _ids(settings, {"STORE": "django", "TTL": 3600, "ON_CONFLICT": "wait"}) == {}
    assert _ids(settings, {"STORE": "redis://127.0.0.1:6379/0", "METHODS": ["POST"]}) == {}


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ({"STORE": "ftp://nowhere"}, "unknown store URL scheme"),
        ({"STORE": "django://nosuchdb"}, "no database 'nosuchdb'"),
        ({"STORE": "sqlite:///"}, "no path"),
    ],
)
def test_bad_store_url_is_reported(settings: Any, value: Any, needle: str) -> None:
    messages = _ids(settings, value)
    assert list(messages) == ["retrysafe.E002"]
    assert needle in messages["retrysafe.E002"]


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ({"TTL": -1}, "ttl must be positive"),
        ({"TLL": 5}, "RETRYSAFE['TLL']: unknown setting"),
        ({"ON_CONFLICT": "maybe"}, "on_conflict must be 'reject' or 'wait'"),
        ({"LEASE": 100, "TTL": 10}, "lease must not be longer than ttl"),
        ({"METHODS": "POST"}, "methods must be a set of values"),
        ({"ON_EVENT": "no.such.hook"}, "cannot import 'no.such.hook'"),
        ("redis://", "must be a dict"),
    ],
)
def test_bad_option_is_reported(settings: Any, value: Any, needle: str) -> None:
    messages = _ids(settings, value)
    assert list(messages) == ["retrysafe.E001"]
    assert needle in messages["retrysafe.E001"]


def test_a_bad_option_and_a_bad_store_are_both_reported(settings: Any) -> None:
    messages = _ids(settings, {"STORE": "ftp://x", "TTL": 0})
    assert sorted(messages) == ["retrysafe.E001", "retrysafe.E002"]


def test_transactional_needs_a_sql_store(settings: Any) -> None:
    messages = _ids(settings, {"STORE": "memory://", "TRANSACTIONAL": True})
    assert "needs a SQL store" in messages["retrysafe.E003"]


def test_middleware_missing_or_before_authentication_is_reported(settings: Any) -> None:
    settings.MIDDLEWARE = ["django.contrib.auth.middleware.AuthenticationMiddleware"]
    assert "retrysafe.W001" in _ids(settings, {"STORE": "memory://"})
    settings.MIDDLEWARE = [
        "retrysafe.contrib.django.IdempotencyMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
    ]
    assert "retrysafe.E005" in _ids(settings, {"STORE": "memory://"})


def test_manage_py_check_fails_with_the_message(settings: Any) -> None:
    settings.RETRYSAFE = {"STORE": "ftp://nowhere"}
    with pytest.raises(SystemCheckError, match=r"retrysafe\.E002.*unknown store URL scheme"):
        call_command("check", stdout=io.StringIO(), stderr=io.StringIO())
    settings.RETRYSAFE = {"STORE": "memory://"}
    out = io.StringIO()
    call_command("check", stdout=out)
    assert "no issues" in out.getvalue()


def test_middleware_refuses_bad_settings_at_start_up(settings: Any) -> None:
    settings.RETRYSAFE = {"STORE": "memory://", "TTL": 0}
    with pytest.raises(ImproperlyConfigured, match="ttl must be positive"):
        IdempotencyMiddleware(lambda request: None)
