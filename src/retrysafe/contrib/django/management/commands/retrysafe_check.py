"""``manage.py retrysafe_check``: check that the store of ``settings.RETRYSAFE`` is reachable
and works (``retrysafe check``, ``flask retrysafe check``)."""

from __future__ import annotations

from typing import Any

from retrysafe.stores import Store

from .....ops import commands as ops
from ..base import StoreCommand


class Command(StoreCommand):
    help = (
        "Check that the idempotency store of settings.RETRYSAFE is reachable and works: "
        + ops.CHECK_WRITES
        + "."
    )

    def run(self, store: Store, options: dict[str, Any]) -> ops.Report:
        return ops.check(store, kind=self.kind(options))
