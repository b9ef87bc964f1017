"""A client process SIGKILLed between its send and the answer, then run again with the same
operation ids: the journal gives it the same keys, so OrderHub replays and no order is doubled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from retrysafe.client import SQLiteJournal

from ..conftest import RUN_ID
from ..e2e.servers import DemoServer
from .conftest import orders_by_item
from .faultproxy import FaultProxy

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = 6
KILL_AT = 2  # the operation in flight when the client dies
DELAY_MS = 700  # the handler's time before it writes the order: the client dies inside it


def client(url: str, journal: Path, operation_ids: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.client.crash_client",
            url,
            str(journal),
            str(DELAY_MS),
            *operation_ids,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.fixture
def watching_proxy(orderhub: DemoServer) -> Iterator[FaultProxy]:
    """A proxy that injects nothing: it tells when a request has fully left the client."""
    proxy = FaultProxy(orderhub.port, lambda n: [])
    proxy.start()
    yield proxy
    proxy.stop()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_sigkilled_client_rerun_with_the_same_operations_makes_one_order_each(
    orderhub: DemoServer, watching_proxy: FaultProxy, tmp_path: Path
) -> None:
    prefix = f"{RUN_ID}-crash-"
    ids = [f"{prefix}{i}" for i in range(OPERATIONS)]
    journal_path = tmp_path / "journal.db"
    journal = SQLiteJournal(journal_path)

    first = client(watching_proxy.url, journal_path, ids)
    assert first.stdout is not None
    finished_first: list[dict[str, object]] = []
    try:
        for line in first.stdout:
            if line.startswith("{"):
                finished_first.append(json.loads(line))
            if line.strip() == f"sending {ids[KILL_AT]}":
                break
        else:
            pytest.fail(f"the client ended early: {first.stderr.read() if first.stderr else ''}")
        # Kill once the whole request has left the client (the handler then sleeps DELAY_MS).
        wait_for(lambda: journal.get(ids[KILL_AT]) is not None, "operation never journaled")
        entry = journal.get(ids[KILL_AT])
        assert entry is not None
        wait_for(lambda: watching_proxy.seen[f'"{entry.key}"'] == 1, "request never sent")
        first.send_signal(signal.SIGKILL)
    finally:
        first.wait(timeout=10)
        first.stdout.close()
        if first.stderr is not None:
            first.stderr.close()
    assert first.returncode == -signal.SIGKILL
    assert [r["operation"] for r in finished_first] == ids[:KILL_AT]

    # The server finished the killed client's order on its own: the effect exists, and the
    # client never learned of it.
    wait_for(
        lambda: orders_by_item(orderhub, ids[KILL_AT])[ids[KILL_AT]] == 1,
        "the in-flight order never appeared",
    )
    killed_key = journal.get(ids[KILL_AT])
    assert killed_key is not None and killed_key.finished_at is None

    second = client(watching_proxy.url, journal_path, ids)
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["operation"] for r in results] == ids
    assert all(r["status"] == 201 for r in results)
    # Everything the first run sent (answered or not) is replayed; the rest runs fresh.
    assert [r["replayed"] for r in results] == [i <= KILL_AT for i in range(OPERATIONS)]
    assert results[KILL_AT]["key"] == killed_key.key
    for earlier, again in zip(finished_first, results, strict=False):
        assert earlier["key"] == again["key"]
    assert orders_by_item(orderhub, prefix) == {i: 1 for i in ids}
    entries = [journal.get(i) for i in ids]
    journal.close()
    assert all(entry is not None and entry.status == 201 for entry in entries)
    print(
        f"crash: {OPERATIONS} operations, 1 client SIGKILL, "
        f"{sum(orders_by_item(orderhub, prefix).values())} orders"
    )
