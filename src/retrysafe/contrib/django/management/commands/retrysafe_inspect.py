"""``manage.py retrysafe_inspect --key K --path /orders`` (or ``--function NAME``): show the
record of one key."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError

from retrysafe.stores import Store

from .....ops.records import describe
from ..base import KeyCommand


class Command(KeyCommand):
    help = "Show the idempotency record of one key (state, lease, stored status)."

    def run(self, store: Store, options: dict[str, Any]) -> None:
        rid = self.record_id(options)
        record = store.get(rid)
        lines = describe(rid, record, function=options["function"])
        if record is None:
            raise CommandError(lines[0])
        self.stdout.write("\n".join(lines))
