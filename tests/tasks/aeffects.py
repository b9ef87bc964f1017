"""The effect of the asyncio queues' jobs (arq, taskiq): :mod:`tests.tasks.effects`'s, written
on the job's transaction (``tx``: the SQLite or PostgreSQL store's own connection, ``asyncpg``
for PostgreSQL) or, for the control, as a plain PostgreSQL row."""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Any

import retrysafe

from .effects import MODE, TABLE, WORK, effects_connection, working


async def charge(order_id: str, amount: int) -> dict[str, Any]:
    working()
    await asyncio.sleep(random.uniform(0, 2 * WORK))
    now = time.time()
    if MODE == "tx":
        conn = await retrysafe.transaction()
        if type(conn).__module__ == "sqlite3":
            conn.execute(f"INSERT INTO {TABLE} VALUES (?, ?, ?)", (order_id, os.getpid(), now))
        else:
            await conn.execute(
                f"INSERT INTO {TABLE} VALUES ($1, $2, $3)", order_id, os.getpid(), now
            )
    else:
        effects_connection().execute(
            f"INSERT INTO {TABLE} VALUES (%s, %s, %s)", (order_id, os.getpid(), now)
        )
    return {"order_id": order_id, "amount": amount}
