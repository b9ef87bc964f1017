"""Caller processes for the cross-process call tests: ``python -m tests.calls.workers MODE ...``.

- ``contend URL FACE KEY START_AT CALLERS RUNS``: CALLERS concurrent callers (threads for ``def``,
  tasks for ``async def``) call one idempotent function with KEY at START_AT (epoch seconds); each
  run of the function appends a line to the file RUNS. Prints one JSON line: the results and the
  exceptions (by type name) the callers got.
- ``hold URL FACE KEY READY [commit]``: one call that writes READY once running (after
  ``mark_committed()`` when asked) and then never returns: SIGKILL it.
- ``pause URL FACE KEY READY LEASE [TABLE]``: one call with a LEASE-second lease that (with TABLE,
  transactionally) inserts KEY into TABLE, writes READY, sleeps 3 s and returns ``"first"``: the
  test SIGSTOPs it past its lease. Prints the call's outcome as one JSON line.
- ``tx URL FACE KEY READY TABLE [orm]``: one transactional call that inserts KEY into TABLE on
  the call's transaction (with ``orm``, through a SQLAlchemy session on it), pausing before and
  after the insert, returns, and then the process waits to be SIGKILLed (at a random point of
  all that).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import retrysafe
from retrysafe import functions, idempotent_function

NAME = "tests.calls.charge"


def insert_sync(conn: Any, url: str, table: str, key: str) -> None:
    """Insert ``key`` into ``table`` on a ``def`` call's transaction connection, in its driver's
    own placeholder style (sqlite3 ``?``, psycopg's raw cursor ``$1``, PyMySQL ``%s``)."""
    if url.startswith("sqlite"):
        conn.execute(f"INSERT INTO {table} (k) VALUES (?)", (key,))
    elif url.startswith("mysql"):
        with conn.cursor() as cur:
            cur.execute(f"INSERT INTO {table} (k) VALUES (%s)", (key,))
    else:
        conn.execute(f"INSERT INTO {table} (k) VALUES ($1)", (key,))


async def insert_async(conn: Any, url: str, table: str, key: str) -> None:
    """The same on an ``async def`` call's connection (sqlite3, asyncpg ``$1``, asyncmy ``%s``)."""
    if url.startswith("sqlite"):
        conn.execute(f"INSERT INTO {table} (k) VALUES (?)", (key,))
    elif url.startswith("mysql"):
        async with conn.cursor() as cur:
            await cur.execute(f"INSERT INTO {table} (k) VALUES (%s)", (key,))
    else:
        await conn.execute(f"INSERT INTO {table} (k) VALUES ($1)", key)


def _mark(path: str, text: str) -> None:
    with open(path, "a") as out:
        out.write(text + "\n")
        out.flush()
        os.fsync(out.fileno())


def contend(url: str, face: str, key: str, start_at: float, callers: int, runs: str) -> None:
    outcomes: list[str] = []
    lock = threading.Lock()

    def record(outcome: str) -> None:
        with lock:
            outcomes.append(outcome)

    if face == "async":

        async def charge(order_id: str) -> dict[str, Any]:
            _mark(runs, str(os.getpid()))
            await asyncio.sleep(1.0)
            return {"charged": order_id, "by": os.getpid()}

        fn = idempotent_function(charge, store=url, key="order_id", name=NAME)

        async def one() -> None:
            try:
                record(json.dumps(await fn(key), sort_keys=True))
            except Exception as exc:
                record(type(exc).__name__)

        async def main() -> None:
            await fn.store.get("warm-up")  # connections open before the start line
            await asyncio.sleep(max(0.0, start_at - time.time()))
            await asyncio.gather(*(one() for _ in range(callers)))
            await fn.aclose()

        asyncio.run(main())
    else:

        def charge_sync(order_id: str) -> dict[str, Any]:
            _mark(runs, str(os.getpid()))
            time.sleep(1.0)
            return {"charged": order_id, "by": os.getpid()}

        fn_sync = idempotent_function(charge_sync, store=url, key="order_id", name=NAME)
        fn_sync.store.get("warm-up")
        barrier = threading.Barrier(callers)

        def one_sync() -> None:
            barrier.wait()
            time.sleep(max(0.0, start_at - time.time()))
            try:
                record(json.dumps(fn_sync(key), sort_keys=True))
            except Exception as exc:
                record(type(exc).__name__)

        threads = [threading.Thread(target=one_sync) for _ in range(callers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        fn_sync.close()
    print(json.dumps(outcomes), flush=True)


def hold(url: str, face: str, key: str, ready: str, commit: bool) -> None:
    if face == "async":

        async def charge(order_id: str) -> None:
            if commit:
                assert await retrysafe.mark_committed()
            _mark(ready, "running")
            await asyncio.sleep(600)

        asyncio.run(idempotent_function(charge, store=url, key="order_id", name=NAME)(key))
    else:

        def charge_sync(order_id: str) -> None:
            if commit:
                assert functions.mark_committed()
            _mark(ready, "running")
            time.sleep(600)

        idempotent_function(charge_sync, store=url, key="order_id", name=NAME)(key)


async def _orm_insert_async(url: str, table: str, key: str) -> None:
    from sqlalchemy import text

    from retrysafe.contrib.sqlalchemy import async_session, session

    insert = text(f"INSERT INTO {table} (k) VALUES (:k)")
    if url.startswith("sqlite"):
        (await session()).execute(insert, {"k": key})
    else:
        await (await async_session()).execute(insert, {"k": key})


def _orm_insert_sync(table: str, key: str) -> None:
    from sqlalchemy import text

    from retrysafe.contrib.sqlalchemy import call_session

    call_session().execute(text(f"INSERT INTO {table} (k) VALUES (:k)"), {"k": key})


def tx(url: str, face: str, key: str, ready: str, table: str, orm: bool = False) -> None:
    if face == "async":

        async def charge(order_id: str) -> str:
            await asyncio.sleep(0.05)
            if orm:
                await _orm_insert_async(url, table, order_id)
            else:
                await insert_async(await retrysafe.transaction(), url, table, order_id)
            await asyncio.sleep(0.05)
            return order_id

        fn = idempotent_function(charge, store=url, key="order_id", name=NAME, transactional=True)

        async def main() -> None:
            await fn.store.get("warm-up")
            _mark(ready, "calling")
            await fn(key)
            _mark(ready, "returned")
            await asyncio.sleep(600)

        asyncio.run(main())
    else:

        def charge_sync(order_id: str) -> str:
            time.sleep(0.05)
            if orm:
                _orm_insert_sync(table, order_id)
            else:
                insert_sync(functions.transaction(), url, table, order_id)
            time.sleep(0.05)
            return order_id

        fn_sync = idempotent_function(
            charge_sync, store=url, key="order_id", name=NAME, transactional=True
        )
        fn_sync.store.get("warm-up")
        _mark(ready, "calling")
        fn_sync(key)
        _mark(ready, "returned")
        time.sleep(600)


def pause(url: str, face: str, key: str, ready: str, lease: float, table: str) -> None:
    options: dict[str, Any] = {"lease": lease, "transactional": bool(table)}
    outcome: Any
    if face == "async":

        async def charge(order_id: str) -> str:
            if table:
                await insert_async(await retrysafe.transaction(), url, table, order_id)
            _mark(ready, "running")
            await asyncio.sleep(3.0)
            return "first"

        fn = idempotent_function(charge, store=url, key="order_id", name=NAME, **options)
        try:
            outcome = asyncio.run(fn(key))
        except Exception as exc:
            outcome = type(exc).__name__
    else:

        def charge_sync(order_id: str) -> str:
            if table:
                insert_sync(functions.transaction(), url, table, key)
            _mark(ready, "running")
            time.sleep(3.0)
            return "first"

        fn_sync = idempotent_function(charge_sync, store=url, key="order_id", name=NAME, **options)
        try:
            outcome = fn_sync(key)
        except Exception as exc:
            outcome = type(exc).__name__
    print(json.dumps(outcome), flush=True)


def main(argv: list[str]) -> None:
    mode, url, face, key = argv[:4]
    rest = argv[4:]
    if mode == "contend":
        contend(url, face, key, float(rest[0]), int(rest[1]), rest[2])
    elif mode == "hold":
        hold(url, face, key, rest[0], commit=rest[1:] == ["commit"])
    elif mode == "pause":
        pause(url, face, key, rest[0], float(rest[1]), rest[2] if len(rest) > 2 else "")
    elif mode == "tx":
        tx(url, face, key, rest[0], rest[1], orm=rest[2:] == ["orm"])
    else:  # pragma: no cover
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    main(sys.argv[1:])
