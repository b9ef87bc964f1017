"""One winner across OS processes: 4 processes x 50 tasks reserve one key at the same moment."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import threading
import time
import uuid

import pytest

from retrysafe.stores import async_store_from_url

from .conftest import Backend

PROCESSES = 4
TASKS = 50


def _contend(
    url: str,
    key: str,
    start_at: float,
    out: mp.Queue[tuple[int, int]],
    all_reserved: threading.Barrier,
) -> None:
    async def main() -> tuple[int, int]:
        store = async_store_from_url(url)
        try:
            # Open connections before the start line so the race is on the reservation.
            await store.get("warm-up-" + key)
            await asyncio.sleep(max(0.0, start_at - time.time()))
            results = await asyncio.gather(
                *(store.reserve(key, "fp", lease=30.0, ttl=60.0) for _ in range(TASKS)),
                return_exceptions=True,
            )
            # Stay alive until every contender has reserved: a process that ended while holding
            # the key is a dead owner, and the stores take a dead owner's key over at once.
            await asyncio.to_thread(all_reserved.wait, 60)
        finally:
            await store.aclose()
        errors = sum(isinstance(r, BaseException) for r in results)
        wins = sum(1 for r in results if not isinstance(r, BaseException) and r.acquired)
        return wins, errors

    out.put(asyncio.run(main()))


# The memory store is per process by design, so it is not among the backends here.
@pytest.mark.parametrize(
    "backend", ["sqlite", "postgres", "mysql", "redis", "redis-cluster"], indirect=True
)
def test_one_winner_among_4_processes_x_50_tasks(backend: Backend) -> None:
    assert backend.url is not None
    ctx = mp.get_context("spawn")
    out: mp.Queue[tuple[int, int]] = ctx.Queue()
    all_reserved = ctx.Barrier(PROCESSES)
    key = f"proc-race-{uuid.uuid4().hex}"
    start_at = time.time() + 3.0
    procs = [
        ctx.Process(target=_contend, args=(backend.url, key, start_at, out, all_reserved))
        for _ in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    assert sum(errors for _, errors in results) == 0
    assert sum(wins for wins, _ in results) == 1
