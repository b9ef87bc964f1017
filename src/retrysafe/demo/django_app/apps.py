"""OrderHub's Django app."""

from __future__ import annotations

from django.apps import AppConfig

__all__ = ["OrderHubConfig"]


class OrderHubConfig(AppConfig):
    """Orders and payments."""

    name = "retrysafe.demo.django_app"
    label = "orderhub"
    default_auto_field = "django.db.models.BigAutoField"
