"""``manage.py retrysafe_purge``: delete expired records."""

from __future__ import annotations

from typing import Any

from retrysafe.stores import Store

from .....ops import commands as ops
from ..base import StoreCommand


class Command(StoreCommand):
    help = "Delete the expired idempotency records of the store in settings.RETRYSAFE."

    def run(self, store: Store, options: dict[str, Any]) -> ops.Report:
        return ops.purge(store)
