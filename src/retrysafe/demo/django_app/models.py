"""OrderHub's data on Django: orders and payments (the fields of :data:`~..domain.KINDS`)."""

from __future__ import annotations

from typing import Any

from django.db import models

from ..domain import ORDERS, PAYMENTS, Kind

__all__ = ["Order", "Payment"]


class _Record(models.Model):
    """What orders and payments share: the owner, the creation time and the JSON shape."""

    kind: Kind
    owner = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        abstract = True

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape of every OrderHub (``created_at`` in UTC with milliseconds)."""
        values: dict[str, Any] = {name: getattr(self, name) for name in self.kind.fields}
        created = self.created_at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return {"id": self.pk, "owner": self.owner, **values, "created_at": created}


class Order(_Record):
    """One order."""

    kind = ORDERS
    item = models.TextField()
    quantity = models.BigIntegerField()

    class Meta:
        app_label = "orderhub"
        db_table = "orderhub_django_orders"


class Payment(_Record):
    """One payment."""

    kind = PAYMENTS
    amount = models.BigIntegerField()
    currency = models.TextField()

    class Meta:
        app_label = "orderhub"
        db_table = "orderhub_django_payments"
