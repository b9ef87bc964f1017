"""The record table of the Django ORM store (created by ``manage.py migrate``)."""

from __future__ import annotations

from django.db import models

__all__ = ["IdempotencyRecord"]


class IdempotencyRecord(models.Model):
    """One idempotency record: the same columns as the SQLite store's table, plus the route and
    creation time the admin shows. The primary key is a hash of (principal, method, path, key):
    the raw key is never stored.

    ``state``: 0 in progress, 1 completed (``response`` stored), 2 in progress with its side
    effects committed. Times are Unix seconds.
    """

    id = models.CharField(primary_key=True, max_length=64)
    fingerprint = models.TextField()
    state = models.SmallIntegerField()
    token = models.TextField(null=True)
    lease_expires_at = models.FloatField()
    expires_at = models.FloatField(db_index=True)
    created_at = models.FloatField()
    route = models.TextField(default="")
    response = models.BinaryField(null=True)

    class Meta:
        app_label = "retrysafe"
        db_table = "retrysafe_record"
        verbose_name = "idempotency record"

    def __str__(self) -> str:
        return f"{self.route or 'record'} {self.id[:12]}"
