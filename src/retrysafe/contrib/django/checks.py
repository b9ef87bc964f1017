"""System checks of ``settings.RETRYSAFE`` (``manage.py check``): a bad store URL or option is
reported with a clear message before the first request."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from ..._core.config import IdempotencyConfig
from ..._core.errors import ConfigurationError
from .conf import Settings, is_django_store, load_settings

__all__ = ["check_settings"]

MIDDLEWARE_PATH = "retrysafe.contrib.django.IdempotencyMiddleware"
_MIDDLEWARE_PATHS = {MIDDLEWARE_PATH, "retrysafe.contrib.django.middleware.IdempotencyMiddleware"}


@register("retrysafe")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Validate ``settings.RETRYSAFE``: the options, the store URL (its scheme, extra and, for
    the ``django`` store, the database alias and the installed app) and the middleware order.
    No store is contacted."""
    from .middleware import sync_store

    errors: list[CheckMessage] = []
    loaded, problems = _load_reporting_each(getattr(settings, "RETRYSAFE", {}))
    for problem in problems:
        errors.append(
            Error(
                str(problem),
                hint="Every option and the values it takes: the Configuration page of "
                "retrysafe's documentation (docs/reference/configuration.md in its repository).",
                id="retrysafe.E001",
            )
        )
    store: Any = None
    try:
        if loaded.store is not None:
            store = sync_store(loaded.store)
    except ConfigurationError as exc:
        errors.append(
            Error(
                f"settings.RETRYSAFE['STORE']: {exc}",
                hint="Use django, django://<alias>, memory://, sqlite:///file.db, "
                "postgresql://... or redis://...",
                id="retrysafe.E002",
            )
        )
    if store is not None:
        if loaded.config.transactional and not callable(getattr(store, "begin", None)):
            errors.append(
                Error(
                    f"settings.RETRYSAFE['TRANSACTIONAL']: needs a SQL store, not "
                    f"{type(store).__name__}",
                    id="retrysafe.E003",
                )
            )
        if isinstance(loaded.store, str) and not is_django_store(loaded.store):
            store.close()
    if is_django_store(loaded.store) and not apps.is_installed("retrysafe.contrib.django"):
        errors.append(
            Error(
                "RETRYSAFE['STORE'] is the django store but its app is not installed",
                hint="Add 'retrysafe.contrib.django' to INSTALLED_APPS, then manage.py migrate.",
                id="retrysafe.E004",
            )
        )
    middleware = list(getattr(settings, "MIDDLEWARE", None) or [])
    found = [i for i, path in enumerate(middleware) if path in _MIDDLEWARE_PATHS]
    if not found:
        errors.append(
            Warning(
                "the retrysafe middleware is not in MIDDLEWARE: nothing is protected",
                hint=f"Add {MIDDLEWARE_PATH!r} after AuthenticationMiddleware (or, where "
                "retrysafe only runs idempotent functions or tasks, silence this check: "
                "SILENCED_SYSTEM_CHECKS = ['retrysafe.W001']).",
                id="retrysafe.W001",
            )
        )
    else:
        auth = "django.contrib.auth.middleware.AuthenticationMiddleware"
        if auth in middleware and middleware.index(auth) > found[0]:
            errors.append(
                Error(
                    "the retrysafe middleware comes before AuthenticationMiddleware: keys would "
                    "not be scoped by request.user",
                    hint="Move it after django.contrib.auth.middleware.AuthenticationMiddleware.",
                    id="retrysafe.E005",
                )
            )
    return errors


def _load_reporting_each(raw: Any) -> tuple[Settings, list[ConfigurationError]]:
    """The settings, and every setting at fault (each one named), so that one ``manage.py
    check`` reports every mistake: a bad setting is set aside and the rest read again. The
    store is ``None`` when ``STORE`` itself is at fault (nothing more to check about it)."""
    problems: list[ConfigurationError] = []
    remaining = dict(raw) if isinstance(raw, dict) else raw
    while True:
        try:
            loaded = load_settings(remaining)
        except ConfigurationError as exc:
            problems.append(exc)
            if not isinstance(remaining, dict) or exc.option not in remaining:
                return Settings(None, IdempotencyConfig()), problems
            del remaining[exc.option]
            continue
        if any(str(problem.option).upper() == "STORE" for problem in problems):
            loaded = Settings(None, loaded.config)
        return loaded, problems
