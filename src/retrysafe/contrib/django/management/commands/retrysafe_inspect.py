"""``manage.py retrysafe_inspect --key K --path /orders`` (or ``--function NAME``): show the
record of one key."""

from __future__ import annotations

from typing import Any

from retrysafe.stores import Store

from .....ops import commands as ops
from ..base import KeyCommand


class Command(KeyCommand):
    help = "Show the idempotency record of one key (state, lease, stored status)."

    def run(self, store: Store, options: dict[str, Any]) -> ops.Report:
        return ops.inspect(store, self.record_id(options), function=options["function"])
