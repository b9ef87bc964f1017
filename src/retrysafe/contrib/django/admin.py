"""A read-only admin of the Django ORM store's records: state, route, created, expires. It never
shows a raw key (records hold only a hash of it), the fencing token or a stored body."""

from __future__ import annotations

import datetime
from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from ..._core.codec import decode_response
from ..._core.errors import CodecError
from .models import IdempotencyRecord

__all__ = ["IdempotencyRecordAdmin"]

_STATES = {0: "in progress", 1: "completed", 2: "in progress, effects committed"}


def _when(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(admin.ModelAdmin):
    """Lists and shows records; nothing can be added, changed or deleted here (use
    ``manage.py retrysafe_resolve`` to free a key)."""

    list_display = ("record", "state_label", "route", "created", "expires", "stored_status")
    list_filter = ("state",)
    search_fields = ("route",)
    ordering = ("-created_at",)
    fields = ("record", "state_label", "route", "created", "expires", "lease_ends",
              "stored_status")  # fmt: skip
    readonly_fields = fields

    @admin.display(description="record")
    def record(self, obj: IdempotencyRecord) -> str:
        """The first characters of the record id (a hash, never the key)."""
        return str(obj.id)[:16]

    @admin.display(description="state", ordering="state")
    def state_label(self, obj: IdempotencyRecord) -> str:
        """The state, in words."""
        return _STATES.get(obj.state, str(obj.state))

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: IdempotencyRecord) -> datetime.datetime:
        """When the key was first reserved."""
        return _when(obj.created_at)

    @admin.display(description="expires", ordering="expires_at")
    def expires(self, obj: IdempotencyRecord) -> datetime.datetime:
        """When the record's retention ends."""
        return _when(obj.expires_at)

    @admin.display(description="lease ends")
    def lease_ends(self, obj: IdempotencyRecord) -> datetime.datetime | None:
        """When an in-progress record's lease ends."""
        return None if obj.state == 1 else _when(obj.lease_expires_at)

    @admin.display(description="stored status")
    def stored_status(self, obj: IdempotencyRecord) -> str:
        """The HTTP status of the stored response (its body is never shown)."""
        if obj.response is None:
            return "-"
        try:
            return str(decode_response(bytes(obj.response)).status)
        except CodecError:
            return "unreadable"

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
