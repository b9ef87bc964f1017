"""Same-transaction mode for calls on SQLite, PostgreSQL and MySQL, ``def`` and ``async def``: the
function's writes on ``transaction()`` and its stored result commit together. A caller process
SIGKILLed at points spread over the call (before its write, between its write and the commit,
after it returned) leaves both (the retry replays) or neither (the retry runs), never one."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

import retrysafe
from retrysafe import functions, idempotent_function
from retrysafe._core.call import call_record_id
from retrysafe.stores import store_from_url

from ..stores import backend_mysql
from ..stores.backend_postgres import admin_connect
from .conftest import StoreURL
from .faces import FACES, Face
from .test_processes import killed, wait_for, worker
from .workers import NAME, insert_async, insert_sync

pytestmark = pytest.mark.e2e

__all__ = ["killed"]

#: Seconds after the worker says "calling" at which it is killed: before the write (the call
#: sleeps 50 ms first), around the write and the commit; ``None``: once the call returned.
KILL_AFTER = (0.0, 0.03, 0.06, 0.09, 0.12, 0.2, None)


@pytest.fixture(params=FACES)
def face(request: pytest.FixtureRequest) -> Face:
    return Face(request.param)


class Effects:
    """The application's table, in the store's own database."""

    def __init__(self, store: StoreURL) -> None:
        self.store = store
        if store.id == "sqlite":
            self.path = store.url.removeprefix("sqlite:///")
            self.table = "effects"
            with sqlite3.connect(self.path) as conn:
                conn.execute("CREATE TABLE IF NOT EXISTS effects (k TEXT NOT NULL)")
        elif store.id == "mysql":
            table = dict(parse_qsl(urlsplit(store.url).query))["table"]
            self.table = f"{table}_effects"  # dropped with the run's tables
            with backend_mysql.admin_connect(store.url) as conn, conn.cursor() as cur:
                cur.execute(f"CREATE TABLE {self.table} (k VARCHAR(200) NOT NULL) ENGINE=InnoDB")
        else:
            schema = store.url.split("table=", 1)[1].split(".", 1)[0].split("&", 1)[0]
            self.table = f"{schema}.effects_{uuid.uuid4().hex[:8]}"
            with admin_connect(store.url) as conn:
                conn.execute(f"CREATE TABLE {self.table} (k TEXT NOT NULL)")

    def count(self, key: str) -> int:
        if self.store.id == "sqlite":
            with sqlite3.connect(self.path) as conn:
                row = conn.execute("SELECT count(*) FROM effects WHERE k = ?", (key,)).fetchone()
        elif self.store.id == "mysql":
            with backend_mysql.admin_connect(self.store.url) as conn, conn.cursor() as cur:
                cur.execute(f"SELECT count(*) FROM {self.table} WHERE k = %s", (key,))
                row = cur.fetchone()
        else:
            with admin_connect(self.store.url) as conn:
                query = f"SELECT count(*) FROM {self.table} WHERE k = %s"
                row = conn.execute(query, (key,)).fetchone()
        assert row is not None
        return int(row[0])


@pytest.fixture
def effects(sql_store: StoreURL) -> Iterator[Effects]:
    yield Effects(sql_store)


def _inserting(
    face: Face, store: StoreURL, table: str, *, raising: BaseException | None = None, **options: Any
) -> Any:
    """An idempotent function that inserts its key into ``table`` on its transaction, then
    returns the key (or raises ``raising``)."""
    if face.is_async:

        async def charge(order_id: str) -> str:
            await insert_async(await retrysafe.transaction(), store.url, table, order_id)
            if raising is not None:
                raise raising
            return order_id

        target: Any = charge
    else:

        def charge_sync(order_id: str) -> str:
            insert_sync(functions.transaction(), store.url, table, order_id)
            if raising is not None:
                raise raising
            return order_id

        target = charge_sync
    return idempotent_function(
        target, store=store.url, key="order_id", transactional=True, **options
    )


def _retry_function(face: Face, store: StoreURL, table: str) -> Any:
    return _inserting(face, store, table, name=NAME, on_conflict="wait", conflict_wait=20.0)


async def test_a_killed_caller_leaves_its_writes_and_result_both_or_neither(
    sql_store: StoreURL, effects: Effects, face: Face, tmp_path: Path, killed: list[Any]
) -> None:
    await _kill_callers(sql_store, effects, face, tmp_path, killed)


@pytest.mark.parametrize("sql_store", [pytest.param("mysql", id="mysql")], indirect=True)
async def test_a_killed_caller_s_sqlalchemy_session_writes_commit_with_the_result_or_vanish(
    sql_store: StoreURL, effects: Effects, face: Face, tmp_path: Path, killed: list[Any]
) -> None:
    await _kill_callers(sql_store, effects, face, tmp_path, killed, "orm")


async def _kill_callers(
    sql_store: StoreURL,
    effects: Effects,
    face: Face,
    tmp_path: Path,
    killed: list[Any],
    *mode: str,
) -> None:
    probe = store_from_url(sql_store.url)
    retry = _retry_function(face, sql_store, effects.table)
    seen: set[tuple[int, bool]] = set()
    try:
        for delay in KILL_AFTER:
            key = f"order-{uuid.uuid4().hex}"
            ready = tmp_path / f"ready-{key}"
            proc = worker("tx", sql_store.url, face.kind, key, str(ready), effects.table, *mode)
            killed.append(proc)
            wait_for(ready, proc)
            if delay is None:
                wait_for(ready, proc, "returned")
            else:
                await asyncio.sleep(delay)
            proc.kill()
            proc.wait(timeout=30)
            record = probe.get(call_record_id(NAME, key))
            stored = record is not None and record.state == "completed"
            rows = effects.count(key)
            assert (rows, stored) in ((0, False), (1, True)), (delay, rows, record)
            seen.add((rows, stored))
            # The retry replays what committed, or runs what did not: one effect either way.
            assert await face.call(retry, key) == key
            assert effects.count(key) == 1
            record = probe.get(call_record_id(NAME, key))
            assert record is not None and record.state == "completed"
    finally:
        await face.close(retry)
        probe.close()
    assert (1, True) in seen  # the kill after the call returned found both committed


async def test_a_final_exception_rolls_the_writes_back_and_is_the_outcome(
    sql_store: StoreURL, effects: Effects, face: Face
) -> None:
    class Declined(Exception):
        pass

    fn = _inserting(face, sql_store, effects.table, raising=Declined("no funds"), final=[Declined])
    try:
        for _ in range(2):
            with pytest.raises(Declined, match="no funds"):
                await face.call(fn, "o-1")
    finally:
        await face.close(fn)
    assert effects.count("o-1") == 0


async def test_a_call_that_never_asks_for_the_connection_completes_plainly(
    sql_store: StoreURL, face: Face
) -> None:
    def compute(n: int) -> int:
        return n * n

    fn = face.define(compute, store=sql_store.url, key="n", transactional=True)
    try:
        assert await face.call(fn, 4) == await face.call(fn, 4) == 16
    finally:
        await face.close(fn)


@pytest.mark.parametrize(
    "sql_store",
    [pytest.param("postgres", id="postgres"), pytest.param("mysql", id="mysql")],
    indirect=True,
)
async def test_a_paused_caller_fenced_out_at_its_commit_rolls_its_writes_back(
    sql_store: StoreURL, effects: Effects, face: Face, tmp_path: Path, killed: list[Any]
) -> None:
    # A writes its row, is paused past its lease; B takes the key over, writes and commits. A
    # resumes: its commit is fenced (B holds the key), so its row rolls back and A's caller
    # gets InProgressError. (Not on SQLite: a paused writer holds SQLite's one write lock, so
    # nobody can take over before it resumes; that is the store's single-writer rule.)
    key = f"order-{uuid.uuid4().hex}"
    ready = tmp_path / "ready"
    proc = worker("pause", sql_store.url, face.kind, key, str(ready), "1.5", effects.table)
    killed.append(proc)
    wait_for(ready, proc)
    proc.send_signal(signal.SIGSTOP)
    await asyncio.sleep(3.0)
    retry = _retry_function(face, sql_store, effects.table)
    try:
        assert await face.call(retry, key) == key
        assert effects.count(key) == 1
        proc.send_signal(signal.SIGCONT)
        out, _ = proc.communicate(timeout=60)
        assert json.loads(out.strip().splitlines()[-1]) == "InProgressError"
        assert effects.count(key) == 1  # A's row rolled back: B's alone
        assert await face.call(retry, key) == key
    finally:
        await face.close(retry)
