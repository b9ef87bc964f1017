"""``settings.RETRYSAFE``: read and validated once (system checks, middleware start-up).

::

    RETRYSAFE = {
        "STORE": "django",          # or "django://<alias>", "redis://...", "postgresql://...",
                                    # "sqlite:///file.db", "memory://", or a store object
        "TTL": 24 * 3600,           # any field of retrysafe.IdempotencyConfig, upper-case
        "REQUIRED": False,
    }

Keys are the fields of :class:`~retrysafe.IdempotencyConfig` in upper case, plus ``STORE``.
``SCOPE_RESOLVER`` and ``ON_EVENT`` take a callable or its dotted path; lists take a list or
comma-separated text (``"POST, PATCH"``); seconds a number or ``"30s"``, ``"1d"``. With the
``django`` store, ``TRANSACTIONAL`` defaults to ``True`` (the view's ORM writes and the stored
response commit together).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

from ..._core.config import OPTIONS, IdempotencyConfig, config_from
from ..._core.errors import ConfigurationError
from ..._core.options import ConfigSource, Setting, read_options

__all__ = ["DEFAULT_STORE", "SOURCE", "Settings", "is_django_store", "load_settings"]

DEFAULT_STORE = "django"

#: ``settings.RETRYSAFE['TTL']``: option names in upper case (read in any case).
SOURCE = ConfigSource(where="settings.RETRYSAFE['{key}']", upper=True)


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
    """Validate ``settings.RETRYSAFE`` (or ``raw``), read as every front reads its settings
    (:meth:`~retrysafe.IdempotencyConfig.from_mapping`: comma-separated text for lists,
    ``"true"``/``"false"``, ``"30s"``, dotted paths for functions).

    Raises:
        ConfigurationError: one clear line naming the setting at fault
            (``settings.RETRYSAFE['TTL']: must be positive, got 0``); its ``option`` is the
            key as written.
    """
    if raw is None:
        raw = getattr(settings, "RETRYSAFE", {})
    if not isinstance(raw, dict):
        raise ConfigurationError(f"settings.RETRYSAFE must be a dict, got {type(raw).__name__}")
    read = read_options(raw, SOURCE, _OPTIONS)
    store = read.pop("store").value if "store" in read else DEFAULT_STORE
    if is_django_store(store) and "transactional" not in read:
        # The view's ORM writes and the stored response commit together by default.
        read["transactional"] = Setting(True, "TRANSACTIONAL", SOURCE.at("TRANSACTIONAL"))
    return Settings(store, config_from(read))


def _store(value: Any) -> Any:
    if not isinstance(value, str) and not callable(getattr(value, "reserve", None)):
        raise ValueError(f"must be a store URL or a store, got {value!r}")
    return value


_OPTIONS = {"store": _store, **OPTIONS}
