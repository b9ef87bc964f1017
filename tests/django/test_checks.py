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
        ({"TTL": -1}, "settings.RETRYSAFE['TTL']: must be positive, got -1"),
        ({"TTL": "1 fortnight"}, "settings.RETRYSAFE['TTL']: must be seconds"),
        ({"TLL": 5}, "settings.RETRYSAFE['TLL']: unknown option (did you mean TTL?)"),
        (
            {"STOER": "memory://"},
            "settings.RETRYSAFE['STOER']: unknown option (did you mean STORE?)",
        ),
        ({"ON_CONFLICT": "maybe"}, "settings.RETRYSAFE['ON_CONFLICT']: must be 'reject' or 'wait'"),
        (
            {"LEASE": 100, "TTL": 10},
            "settings.RETRYSAFE['LEASE']: must not be longer than settings.RETRYSAFE['TTL'] (10 s)",
        ),
        ({"METHODS": 7}, "settings.RETRYSAFE['METHODS']: must be a list"),
        ({"REQUIRED": "maybe"}, "settings.RETRYSAFE['REQUIRED']: must be true or false"),
        (
            {"ON_EVENT": "no.such.hook"},
            "settings.RETRYSAFE['ON_EVENT']: cannot import 'no.such.hook'",
        ),
        ({"STORE": 5}, "settings.RETRYSAFE['STORE']: must be a store URL or a store, got 5"),
        ("redis://", "must be a dict"),
    ],
)
def test_bad_option_is_reported_naming_the_setting(settings: Any, value: Any, needle: str) -> None:
    messages = _ids(settings, value)
    assert list(messages) == ["retrysafe.E001"]
    assert needle in messages["retrysafe.E001"]


def test_every_bad_setting_gets_its_own_e001(settings: Any) -> None:
    settings.RETRYSAFE = {"STORE": "memory://", "TTL": 0, "REQIRED": True, "METHODS": "POST"}
    messages = [m.msg for m in check_settings() if m.id == "retrysafe.E001"]
    assert len(messages) == 2, messages
    assert messages[0].startswith("settings.RETRYSAFE['TTL']: must be positive")
    assert "settings.RETRYSAFE['REQIRED']: unknown option (did you mean REQUIRED?)" in messages[1]


def test_text_values_read_as_on_every_front(settings: Any) -> None:
    """Comma-separated lists, yes/no and durations mean what they mean in app.config, TOML,
    variables and flags (Flask and Django agree)."""
    from retrysafe.contrib.django.conf import load_settings

    raw = {"STORE": "memory://", "METHODS": "post, put", "REQUIRED": "yes", "TTL": "2h"}
    settings.RETRYSAFE = raw
    assert _ids(settings, raw) == {}
    config = load_settings().config
    assert config.methods == frozenset({"POST", "PUT"})
    assert config.required is True and config.ttl == 7200


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
    with pytest.raises(ImproperlyConfigured, match=r"settings.RETRYSAFE\['TTL'\]: must be posi"):
        IdempotencyMiddleware(lambda request: None)
