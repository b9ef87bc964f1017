"""Django integration: middleware (sync and async), ``settings.RETRYSAFE`` with system checks,
per-view ``@idempotent`` (function views, class-based views, DRF actions), the Django ORM store
(``"django"``: the view's ORM writes and the stored response commit together), management
commands and a read-only admin.

Set-up::

    INSTALLED_APPS = [..., "retrysafe.contrib.django"]
    MIDDLEWARE = [..., "django.contrib.auth.middleware.AuthenticationMiddleware",
                  "retrysafe.contrib.django.IdempotencyMiddleware"]
    RETRYSAFE = {"STORE": "django"}          # then: python manage.py migrate

Submodules import Django; importing this package does not need the app registry.
"""

from __future__ import annotations

from typing import Any

from ..._core.routes import idempotent

__all__ = [
    "IdempotencyMiddleware",
    "amark_committed",
    "atransaction",
    "idempotent",
    "mark_committed",
    "transaction",
]


def __getattr__(name: str) -> Any:
    # Lazy: settings.MIDDLEWARE names "retrysafe.contrib.django.IdempotencyMiddleware", and
    # INSTALLED_APPS imports this package before the app registry is ready.
    if name in {"IdempotencyMiddleware", "mark_committed", "amark_committed", "transaction",
                "atransaction"}:  # fmt: skip
        from . import middleware

        return getattr(middleware, name)
    raise AttributeError(name)
