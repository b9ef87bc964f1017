"""The Django app of retrysafe: add ``"retrysafe.contrib.django"`` to ``INSTALLED_APPS``."""

from __future__ import annotations

from django.apps import AppConfig

__all__ = ["RetrySafeConfig"]


class RetrySafeConfig(AppConfig):
    """Registers the system checks of ``settings.RETRYSAFE`` and the record model."""

    name = "retrysafe.contrib.django"
    label = "retrysafe"
    verbose_name = "retrysafe"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the checks
