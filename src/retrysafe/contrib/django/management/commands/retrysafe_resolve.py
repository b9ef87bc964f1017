"""``manage.py retrysafe_resolve --key K --path /orders`` (or ``--function NAME``): delete the
record of one key (e.g. an outcome-unknown key after checking that its effects did not happen),
so the next request or call with it runs."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from retrysafe.stores import Store

from .....ops import commands as ops
from ..base import KeyCommand


class Command(KeyCommand):
    help = "Delete the idempotency record of one key, so the next request with it runs."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--force", action="store_true", help="also delete a stored response")

    def run(self, store: Store, options: dict[str, Any]) -> ops.Report:
        rid = self.record_id(options)
        return ops.resolve(store, rid, force=options["force"], call=options["function"] is not None)
