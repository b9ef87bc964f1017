"""``settings.RETRYSAFE``: read and validated once (system checks, middleware start-up).

::

    RETRYSAFE = {
        "STORE": "django",          # or "django://<alias>", "redis://...", "postgresql://...",
                                    # "sqlite:///file.db", "memory://", or a store object
        "TTL": 24 * 3600,           # any field of retrysafe.IdempotencyConfig, upper-case
        "REQUIRED": False,
    }

Keys are the fields of :class:`~retrysafe.IdempotencyConfig` in upper case, plus ``STORE``.
``SCOPE_RESOLVER`` and ``ON_EVENT`` take a callable or its dotted path. With the ``django``
store, ``TRANSACTIONAL`` defaults to ``True`` (the view's ORM writes and the stored response
commit together).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from ..._core.config import IdempotencyConfig
from ..._core.errors import ConfigurationError

__all__ = ["DEFAULT_STORE", "Settings", "is_django_store", "load_settings"]

DEFAULT_STORE = "django"

_FIELDS = {f.name for f in fields(IdempotencyConfig) if f.init}
_SETS = {"methods", "release_statuses", "replay_header_denylist", "replay_header_allowlist"}
_CALLABLES = {"scope_resolver", "on_event"}


@dataclass(frozen=True)
class Settings:
    """What ``settings.RETRYSAFE`` says.

    Attributes:
        store: a store URL or a store object.
        config: the validated settings.
    """

    store: Any
    config: IdempotencyConfig


def is_django_store(store: Any) -> bool:
    """Whether ``store`` names the Django ORM store (``django`` or ``django://<alias>``)."""
    return isinstance(store, str) and (store == "django" or store.startswith("django://"))


def load_settings(raw: Any = None) -> Settings:
    """Validate ``settings.RETRYSAFE`` (or ``raw``).

    Raises:
        ConfigurationError: one clear line naming the setting at fault.
    """
    if raw is None:
        raw = getattr(settings, "RETRYSAFE", {})
    if not isinstance(raw, dict):
        raise ConfigurationError(f"settings.RETRYSAFE must be a dict, got {type(raw).__name__}")
    store: Any = DEFAULT_STORE
    options: dict[str, Any] = {}
    for key, value in raw.items():
        name = str(key).lower()
        if name == "store":
            store = value
            continue
        if name not in _FIELDS:
            known = ", ".join(sorted(n.upper() for n in _FIELDS | {"store"}))
            raise ConfigurationError(f"RETRYSAFE[{key!r}]: unknown setting (known: {known})")
        if name in _CALLABLES and isinstance(value, str):
            try:
                value = import_string(value)
            except ImportError as exc:
                raise ConfigurationError(f"RETRYSAFE[{key!r}]: cannot import {value!r}") from exc
        elif name in _SETS and value is not None and not isinstance(value, str | bytes):
            try:
                value = frozenset(value)
            except TypeError as exc:
                raise ConfigurationError(
                    f"RETRYSAFE[{key!r}] must be a list of values, got {value!r}"
                ) from exc
        options[name] = value
    if not isinstance(store, str) and not callable(getattr(store, "reserve", None)):
        raise ConfigurationError(f"RETRYSAFE['STORE'] must be a store URL or store, not {store!r}")
    if is_django_store(store):
        options.setdefault("transactional", True)
    try:
        config = IdempotencyConfig(**options)
    except ConfigurationError as exc:
        raise ConfigurationError(f"RETRYSAFE: {exc}") from exc
    except TypeError as exc:  # e.g. a string where a number belongs, caught in comparisons
        raise ConfigurationError(f"RETRYSAFE: a setting has the wrong type ({exc})") from exc
    return Settings(store, config)
