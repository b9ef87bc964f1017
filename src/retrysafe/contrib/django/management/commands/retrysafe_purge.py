"""``manage.py retrysafe_purge``: delete expired records."""

from __future__ import annotations

from typing import Any

from retrysafe.stores import Store

from ..base import StoreCommand


class Command(StoreCommand):
    help = "Delete the expired idempotency records of the store in settings.RETRYSAFE."

    def run(self, store: Store, options: dict[str, Any]) -> None:
        self.stdout.write(f"purged {store.purge_expired()} expired records")
