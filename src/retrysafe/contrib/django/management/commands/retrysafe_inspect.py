"""``manage.py retrysafe_inspect --key K --path /orders``: show the record of one key."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError

from retrysafe.stores import Store

from ....._core.codec import decode_response
from ..base import KeyCommand


class Command(KeyCommand):
    help = "Show the idempotency record of one key (state, lease, stored status)."

    def run(self, store: Store, options: dict[str, Any]) -> None:
        rid = self.record_id(options)
        record = store.get(rid)
        if record is None:
            raise CommandError(f"record {rid[:16]}: none (never used, released, or expired)")
        state: str = record.state
        if state == "in_progress" and record.committed:
            state = "in_progress, effects committed"
            if record.lease_remaining <= 0:
                state = "OUTCOME UNKNOWN (effects committed, response never stored)"
        self.stdout.write(f"record {rid[:16]}: {state}")
        if record.state == "in_progress":
            self.stdout.write(f"  lease remaining: {record.lease_remaining:.1f} s")
        elif record.response is not None:
            stored = decode_response(record.response)
            self.stdout.write(f"  status: {stored.status}, body: {len(stored.body)} bytes")
