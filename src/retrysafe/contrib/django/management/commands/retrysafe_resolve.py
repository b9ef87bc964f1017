"""``manage.py retrysafe_resolve --key K --path /orders``: delete the record of one key (e.g. an
outcome-unknown key after checking that its effects did not happen), so the next request with
it runs."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from retrysafe.stores import Store

from ..base import KeyCommand


class Command(KeyCommand):
    help = "Delete the idempotency record of one key, so the next request with it runs."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--force", action="store_true", help="also delete a stored response")

    def run(self, store: Store, options: dict[str, Any]) -> None:
        rid = self.record_id(options)
        record = store.get(rid)
        if record is None:
            raise CommandError(f"record {rid[:16]}: none; nothing to resolve")
        if record.state == "completed" and not options["force"]:
            raise CommandError(
                f"record {rid[:16]} is completed; use --force to delete a stored response"
            )
        store.delete(rid)
        self.stdout.write(f"record {rid[:16]} deleted: the next request with this key runs")
