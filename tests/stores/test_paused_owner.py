"""What the stores guide says of a paused owner: it keeps its keys only while the pause is
shorter than the lease. A process running an idempotent function with a 2 s lease is paused
(SIGSTOP) for longer; its lease lapses unrenewed and a retry from another process runs the
function again about 2 s after the pause began, on every shared store (liveness says the owner
is alive, but the lease is what a pause outlasts)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid

import pytest

from retrysafe import InProgressError, idempotent_function

from .conftest import Backend

LEASE = 2.0

_OWNER = """
import sys, time
from retrysafe import idempotent_function

@idempotent_function(store=sys.argv[1], key="order_id", lease=2.0, name="paused-owner")
def ship(order_id: str) -> str:
    print("running", flush=True)
    time.sleep(10)
    return "owner"

ship(sys.argv[2])
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["sqlite", "postgres", "redis"], indirect=True)
def test_a_pause_longer_than_the_lease_loses_the_key_when_the_lease_lapses(
    backend: Backend,
) -> None:
    assert backend.url is not None
    key = f"paused-{uuid.uuid4().hex}"
    runs: list[str] = []

    @idempotent_function(store=backend.url, key="order_id", lease=LEASE, name="paused-owner")
    def ship(order_id: str) -> str:
        runs.append(order_id)
        return "retry"

    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER, backend.url, key], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "running"
        time.sleep(1.0)  # the owner renews its lease while it runs
        owner.send_signal(signal.SIGSTOP)
        paused = time.monotonic()
        while True:  # a 5 s pause at most
            elapsed = time.monotonic() - paused
            assert elapsed < 5.0, "the paused owner kept its key past its lease"
            try:
                assert ship(key) == "retry"
                break
            except InProgressError:
                time.sleep(0.05)
        assert runs == [key]  # run again, by the retry
        assert 0.5 < elapsed < 3.5, elapsed  # when the last renewal's lease lapsed
    finally:
        owner.send_signal(signal.SIGCONT)
        owner.kill()
        owner.wait(timeout=10)
        if owner.stdout is not None:
            owner.stdout.close()
        ship.close()
