"""SQLiteJournal on a real file: one key per operation id across instances, threads and
processes; finished operations pruned after the retention; operations bound to the context."""

from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3
import threading
import uuid
from pathlib import Path

import pytest

from retrysafe import ConfigurationError
from retrysafe.client import Journal, Operation, RetryPolicy, SQLiteJournal, current_operation

from ..clock import FakeClock


def test_claim_keeps_the_first_key(tmp_path: Path) -> None:
    journal = SQLiteJournal(tmp_path / "j.db")
    assert journal.claim("op", "k1") == "k1"
    assert journal.claim("op", "k2") == "k1"
    assert journal.claim("other", "k3") == "k3"
    journal.close()


def test_the_key_is_on_disk_for_a_new_instance(tmp_path: Path) -> None:
    first = SQLiteJournal(tmp_path / "sub" / "j.db")  # the folder is created
    op = first.operation("checkout-42")
    first.close()
    second = SQLiteJournal(tmp_path / "sub" / "j.db")
    again = second.operation("checkout-42")
    assert again.key == op.key
    assert uuid.UUID(op.key).version == 4
    assert op.header_value == f'"{op.key}"'
    assert isinstance(first, Journal)
    assert op.key not in repr(op)
    second.close()


def test_durable_settings(tmp_path: Path) -> None:
    journal = SQLiteJournal(tmp_path / "j.db")
    journal.claim("op", "k")
    conn = sqlite3.connect(tmp_path / "j.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    assert journal._conn is not None
    assert journal._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    journal.close()


def _claim_in_process(path: str, op: str, out: multiprocessing.Queue[str]) -> None:
    journal = SQLiteJournal(path)
    key = journal.claim(op, str(uuid.uuid4()))
    out.put(key)
    journal.close()


def test_concurrent_processes_agree_on_one_key(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    path = str(tmp_path / "j.db")
    SQLiteJournal(path).claim("warm-up", "x")  # the schema exists before the race
    procs = [ctx.Process(target=_claim_in_process, args=(path, "op", queue)) for _ in range(4)]
    for p in procs:
        p.start()
    keys = {queue.get(timeout=30) for _ in procs}
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert len(keys) == 1


def test_concurrent_threads_agree_on_one_key(tmp_path: Path) -> None:
    journal = SQLiteJournal(tmp_path / "j.db")
    keys: list[str] = []
    barrier = threading.Barrier(8)

    def claim() -> None:
        barrier.wait()
        keys.append(journal.operation("op").key)

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(keys)) == 1 and len(keys) == 8
    journal.close()


def test_finished_operations_are_pruned_after_the_retention(tmp_path: Path) -> None:
    clock = FakeClock()
    journal = SQLiteJournal(tmp_path / "j.db", retention=100, clock=clock)
    done, open_ = journal.operation("done"), journal.operation("open")
    done.finish(201)
    entry = journal.get("done")
    assert entry is not None and (entry.status, entry.finished_at) == (201, clock.now)
    clock.now += 100
    assert journal.prune() == 0
    clock.now += 1
    assert journal.prune() == 1
    assert journal.get("done") is None
    # Unfinished operations stay: their key is still needed after a restart.
    assert journal.get("open") is not None and journal.operation("open").key == open_.key
    # A pruned id starts over with a new key.
    assert journal.operation("done").key != done.key
    journal.close()


def test_finish_keeps_the_first_answer(tmp_path: Path) -> None:
    journal = SQLiteJournal(tmp_path / "j.db")
    journal.operation("op").finish(201)
    journal.operation("op").finish(422)
    entry = journal.get("op")
    assert entry is not None and entry.status == 201
    journal.close()


@pytest.mark.parametrize("bad", ["", "x" * 513])
def test_bad_operation_ids_are_rejected(tmp_path: Path, bad: str) -> None:
    journal = SQLiteJournal(tmp_path / "j.db")
    with pytest.raises(ConfigurationError):
        journal.operation(bad)
    journal.close()


def test_negative_retention_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError):
        SQLiteJournal(tmp_path / "j.db", retention=-1)


def test_with_block_binds_the_operation_to_the_context(tmp_path: Path) -> None:
    journal = SQLiteJournal(tmp_path / "j.db")
    outer, inner = journal.operation("outer"), journal.operation("inner")
    assert current_operation() is None
    with outer:
        assert current_operation() is outer
        with inner:
            assert current_operation() is inner
        assert current_operation() is outer
    assert current_operation() is None
    journal.close()


async def test_async_operations_are_bound_per_task(tmp_path: Path) -> None:
    journal = SQLiteJournal(tmp_path / "j.db")
    seen: dict[str, Operation | None] = {}

    async def task(name: str) -> None:
        async with await journal.aoperation(name) as op:
            await asyncio.sleep(0.01)
            seen[name] = current_operation()
            assert seen[name] is op

    await asyncio.gather(task("a"), task("b"))
    assert seen["a"] is not None and seen["b"] is not None
    assert (seen["a"].id, seen["b"].id) == ("a", "b")
    assert current_operation() is None
    journal.close()


class DictJournal:
    """A journal kept elsewhere (here: a dict), through the documented two-method protocol."""

    def __init__(self) -> None:
        self.keys: dict[str, str] = {}
        self.finished: dict[str, int] = {}

    def claim(self, operation_id: str, key: str) -> str:
        return self.keys.setdefault(operation_id, key)

    def finish(self, operation_id: str, status: int) -> None:
        self.finished[operation_id] = status


def test_any_journal_with_claim_and_finish_binds_keys() -> None:
    journal = DictJournal()
    assert isinstance(journal, Journal)
    op = Operation.open(journal, "checkout-7")
    assert Operation.open(journal, "checkout-7").key == op.key == journal.keys["checkout-7"]
    with op:
        call = RetryPolicy().start("POST", operation=current_operation())
    assert (call.key, call.header_to_add) == (op.key, op.header_value)
    op.finish(201)
    assert journal.finished == {"checkout-7": 201}
    with pytest.raises(ConfigurationError):
        Operation.open(journal, "")


def test_a_journal_truncated_to_zero_bytes_is_refused_not_started_over(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    journal = SQLiteJournal(path)
    first = journal.operation("checkout-1")
    journal.close()
    path.write_bytes(b"")  # truncated (a bad copy, a full disk, `: > j.db`)
    rerun = SQLiteJournal(path)
    with pytest.raises(ConfigurationError, match="empty: it was truncated or replaced"):
        rerun.operation("checkout-1")
    rerun.close()
    assert path.read_bytes() == b""  # left as found, for the operator
    # Deleting it is the way to start over.
    path.unlink()
    fresh = SQLiteJournal(path)
    assert fresh.operation("checkout-1").key != first.key
    fresh.close()


def test_a_new_journal_appears_whole_and_leaves_no_staging_files(tmp_path: Path) -> None:
    journal = SQLiteJournal(tmp_path / "j.db")
    journal.claim("op", "k")
    journal.close()
    assert (tmp_path / "j.db").stat().st_size > 0
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
