"""The SQLite URL store while another process holds the database's single write lock: the
contention rows of :mod:`tests.stores.sqlite_contention` on its async and sync faces (the Django
ORM store runs the same rows in ``tests/django/test_orm_busy.py``). New keys wait for the lease
by default on the async face, for ``busy_timeout`` (the URL's, or 30 s) on the sync one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from retrysafe.stores import AsyncSQLiteStore, SQLiteStore, async_store_from_url
from retrysafe.stores.sqlite import SQLiteBusyError

from .sqlite_contention import (
    Face,
    async_face,
    bounded_wait_row,
    holding,
    new_keys_row,
    records_row,
    seed,
    sync_face,
)

FACES = ["sqlite-async", "sqlite-sync"]


def _records(path: Path) -> dict[str, str]:
    store = SQLiteStore(path)
    try:
        return seed(store)
    finally:
        store.close()


@pytest.fixture(params=FACES)
async def face(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Face]:
    """A face of the SQLite URL store over ``tmp_path / "s.db"``."""
    path = tmp_path / "s.db"
    if request.param == "sqlite-async":
        store = AsyncSQLiteStore(path)
        yield async_face(request.param, store)
        await store.aclose()
    else:
        sync = SQLiteStore(path)
        yield sync_face(request.param, sync)
        sync.close()


async def test_keys_with_a_record_are_answered_while_another_process_holds_the_lock(
    tmp_path: Path, face: Face
) -> None:
    expected = _records(tmp_path / "s.db")
    with holding(tmp_path / "s.db") as holder:
        await records_row(face, holder, expected)


async def test_new_keys_queue_for_the_lock_without_blocking_the_loop(
    tmp_path: Path, face: Face
) -> None:
    _records(tmp_path / "s.db")
    with holding(tmp_path / "s.db") as holder:
        await new_keys_row(face, holder)


@pytest.mark.parametrize("which", FACES)
async def test_a_new_key_waits_at_most_its_bound_then_the_store_is_busy(
    tmp_path: Path, which: str
) -> None:
    """The async face's bound is the lease asked for (0.3 s here); the sync face's, its
    ``busy_timeout`` (0.3 s here)."""
    path = tmp_path / "s.db"
    _records(path)
    if which == "sqlite-async":
        store: AsyncSQLiteStore | SQLiteStore = AsyncSQLiteStore(path)
        face = async_face(which, store)
    else:
        store = SQLiteStore(path, busy_timeout=0.3)
        face = sync_face(which, store)
    try:
        with holding(path) as holder:
            await bounded_wait_row(face, holder, lease=0.3)
    finally:
        if isinstance(store, AsyncSQLiteStore):
            await store.aclose()
        else:
            store.close()


@pytest.mark.parametrize("face", ["async", "sync"])
async def test_busy_timeout_in_the_url_bounds_the_wait(tmp_path: Path, face: str) -> None:
    path = tmp_path / "s.db"
    _records(path)
    url = f"sqlite:///{path}?busy_timeout=0.2"
    store = async_store_from_url(url) if face == "async" else SQLiteStore.from_url(url)
    assert isinstance(store, AsyncSQLiteStore | SQLiteStore)
    try:
        with holding(path) as holder:
            with pytest.raises(SQLiteBusyError):
                if isinstance(store, AsyncSQLiteStore):
                    await store.reserve("new", "fp", lease=30.0, ttl=60.0)
                else:
                    store.reserve("new", "fp", lease=30.0, ttl=60.0)
            assert holder.still_holds()
    finally:
        if isinstance(store, AsyncSQLiteStore):
            await store.aclose()
        else:
            store.close()


def test_a_bad_busy_timeout_option_is_a_configuration_error(tmp_path: Path) -> None:
    from retrysafe import ConfigurationError

    for value in ("x", "-1", "inf", "nan"):
        with pytest.raises(ConfigurationError, match="busy_timeout"):
            async_store_from_url(f"sqlite:///{tmp_path}/s.db?busy_timeout={value}")


async def test_waiters_for_the_write_lock_take_turns_settling_first_then_in_arrival_order() -> None:
    """In one process, only the waiter whose turn it is polls SQLite's lock: a later arrival
    can no longer win it again and again ahead of one that has waited for seconds (the latency
    tail of a busy file), and a held key's settlement goes before new reservations."""
    from retrysafe.stores.sqlite._busy import CLAIM, SETTLE, _Turns

    turns = _Turns()
    assert await turns.acquire(CLAIM, 1.0)  # free: at once
    order: list[str] = []

    async def wait(name: str, priority: int, within: float = 5.0) -> None:
        if await turns.acquire(priority, within):
            order.append(name)
            await asyncio.sleep(0.01)
            turns.release()
        else:
            order.append(f"{name} gave up")

    waiters = [
        asyncio.create_task(wait("first claim", CLAIM)),
        asyncio.create_task(wait("impatient", CLAIM, within=0.05)),
        asyncio.create_task(wait("second claim", CLAIM)),
        asyncio.create_task(wait("settle", SETTLE)),
    ]
    cancelled = asyncio.create_task(wait("cancelled", SETTLE))
    await asyncio.sleep(0.1)
    cancelled.cancel()
    turns.release()
    await asyncio.gather(*waiters)
    assert order == ["impatient gave up", "settle", "first claim", "second claim"]
    assert not turns.held and not turns.heap


async def test_a_waiter_in_the_queue_is_answered_by_a_read_without_its_turn() -> None:
    """A duplicate queued behind other writers re-reads its key: once the first request's
    reservation has committed, it is answered from that read (409 or replay), not after every
    writer ahead of it."""
    from retrysafe.stores.sqlite import retry_while_busy

    def busy() -> str:
        raise SQLiteBusyError("database is locked")

    reads = iter([None, None, "the record"])
    head = asyncio.create_task(
        retry_while_busy(busy, busy_timeout=1.0, what="reserve", path="/tmp/turns-test.db")
    )
    await asyncio.sleep(0.01)  # the head takes the turn and polls
    started = asyncio.get_running_loop().time()
    answer = await retry_while_busy(
        busy,
        busy_timeout=1.0,
        what="reserve",
        path="/tmp/turns-test.db",
        settled=lambda: next(reads),
    )
    assert answer == "the record"
    assert asyncio.get_running_loop().time() - started < 0.9 and not head.done()
    with pytest.raises(SQLiteBusyError, match="stayed taken"):
        await head
