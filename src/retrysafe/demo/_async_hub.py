"""OrderHub's data layer and its one write path, for the async apps (Starlette, FastAPI).

The sync twin, ``_sync_hub.py`` (Flask), is generated from this file by ``scripts/unasync.py``
(``make lint`` checks that it is up to date): edit this file, then run the script. What differs
per driver is in ``_drivers.py``; the Django OrderHub writes through its ORM instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from .. import mark_committed, transaction
from ._drivers import open_async_driver, record
from .domain import KINDS, Kind, Knobs

__all__ = ["AsyncOrderHub"]

#: The largest id or ``?limit=`` the databases take (a signed 64-bit integer).
_MAX_INT64 = 2**63 - 1


class AsyncOrderHub:
    """Orders and payments in SQLite or PostgreSQL (``--db``), and how a ``POST`` creates one.

    Args:
        db_url: ``sqlite:///path.db`` or ``postgresql://...`` (``?schema=NAME``), shared by every
            OrderHub process pointed at it.
        transactional: write each record on the connection of the request's idempotent
            transaction, so it commits together with the stored response (the store is SQL
            and keeps its records in this very database); otherwise mark the effect committed
            right after the write.

    Raises:
        ConfigurationError: neither SQLite nor PostgreSQL, or a bad URL option.
    """

    def __init__(self, db_url: str, *, transactional: bool) -> None:
        self.url = db_url
        self.transactional = transactional
        self._driver = open_async_driver(db_url)
        self._sql = self._driver.sql

    async def create(
        self, kind: Kind, values: Mapping[str, Any], owner: str, knobs: Knobs, scope: Any
    ) -> dict[str, Any]:
        """Run a ``POST``: the knobs around the write of one record.

        Args:
            kind: orders or payments.
            values: the checked fields (:func:`~retrysafe.demo.domain.parse_record`).
            owner: the demo user.
            knobs: the request's knobs.
            scope: the request's ASGI scope (its idempotency context).

        Returns:
            The record as written.

        Raises:
            DemoFailure: ``?fail=1``; nothing was written.
            DatabaseUnavailable: the database stayed busy or is unreachable; nothing was written.
        """
        if knobs.delay:
            await asyncio.sleep(knobs.delay)
        knobs.fail_if_asked(kind)
        params = (owner, *(values[name] for name in kind.fields))
        if self.transactional:
            # The record commits together with the stored response (exactly once, even on a
            # crash); without a key there is no transaction and it commits on its own.
            conn = await transaction(scope, optional=True)
            rows = await self._driver.run(self._sql.insert(kind), params, conn=conn, write=True)
        else:
            rows = await self._driver.run(self._sql.insert(kind), params, write=True)
            # From here a crash must not lead to a second record: retries get "outcome unknown".
            await mark_committed(scope)
        if knobs.delay_after:
            await asyncio.sleep(knobs.delay_after)
        return record(kind, rows[0])

    async def list(self, kind: Kind, limit: int | None = None) -> tuple[int, list[dict[str, Any]]]:
        """Return (the total count, the records newest first: at most ``limit``)."""
        [(count,)] = await self._driver.run(self._sql.count(kind))
        if limit is None:
            rows = await self._driver.run(self._sql.newest(kind, limited=False))
        else:
            rows = await self._driver.run(
                self._sql.newest(kind, limited=True), (min(limit, _MAX_INT64),)
            )
        return int(count), [record(kind, row) for row in rows]

    async def get(self, kind: Kind, record_id: int) -> dict[str, Any] | None:
        """Return one record, or ``None``."""
        if not 1 <= record_id <= _MAX_INT64:  # no such id was ever handed out
            return None
        rows = await self._driver.run(self._sql.by_id(kind), (record_id,))
        return record(kind, rows[0]) if rows else None

    async def reset(self) -> None:
        """Delete every order and payment (the idempotency records stay)."""
        for kind in KINDS.values():
            await self._driver.run(self._sql.delete(kind), write=True)

    async def aclose(self) -> None:
        """Release the database connections."""
        await self._driver.aclose()
