"""OrderHub's data: orders and payments."""

from __future__ import annotations

from typing import Any

from django.db import models

__all__ = ["Order", "Payment"]


class Order(models.Model):
    """One order."""

    owner = models.TextField()
    item = models.TextField()
    quantity = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "orderhub"
        db_table = "orderhub_django_orders"

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape of the Starlette OrderHub."""
        return {
            "id": self.pk,
            "owner": self.owner,
            "item": self.item,
            "quantity": self.quantity,
            "created_at": self.created_at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        }


class Payment(models.Model):
    """One payment."""

    owner = models.TextField()
    amount = models.BigIntegerField()
    currency = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "orderhub"
        db_table = "orderhub_django_payments"

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape of the Starlette OrderHub."""
        return {
            "id": self.pk,
            "owner": self.owner,
            "amount": self.amount,
            "currency": self.currency,
            "created_at": self.created_at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        }
