"""Calls across real processes on the shared stores (SQLite, PostgreSQL, Redis), ``def`` and
``async def``: 50 concurrent callers in 5 processes run the function once; a SIGKILLed caller's
key is taken over at once by the next caller (owner liveness), or, once its effects were marked
committed, ends in "outcome unknown" as soon, never run again."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from retrysafe import OutcomeUnknownError

from .conftest import StoreURL
from .faces import FACES, Face
from .workers import NAME

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
PROCESSES = 5
CALLERS = 10
#: Upper bounds on "dead owner noticed" (seconds after SIGKILL), generous for a loaded 2-core
#: machine: milliseconds for PostgreSQL and SQLite, the heartbeat TTL (5 s) for Redis. The lease
#: is 30 s: a takeover after the lease could never pass.
TAKEOVER_BOUND = {"sqlite": 4.0, "postgres": 4.0, "redis": 5.0 + 4.0}


@pytest.fixture(params=FACES)
def face(request: pytest.FixtureRequest) -> Face:
    return Face(request.param)


def worker(*args: str) -> subprocess.Popen[str]:
    """Start ``python -m tests.calls.workers ARGS``."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.calls.workers", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def killed() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes to SIGKILL at the end whatever happened."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


def wait_for(path: Path, proc: subprocess.Popen[str], text: str = "", timeout: float = 60.0) -> str:
    """The content of ``path`` once the worker wrote it (and it contains ``text``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and (found := path.read_text()) and text in found:
            return found
        if proc.poll() is not None:
            raise AssertionError(f"worker ended early: {proc.communicate()}")
        time.sleep(0.02)
    raise AssertionError(f"{path} never written")


def test_50_callers_in_5_processes_run_the_function_once(
    shared_store: StoreURL, face: Face, tmp_path: Path
) -> None:
    key = f"order-{uuid.uuid4().hex}"
    runs = tmp_path / "runs"
    start_at = time.time() + 8.0  # every process is up and connected by then
    procs = [
        worker("contend", shared_store.url, face.kind, key, str(start_at), str(CALLERS), str(runs))
        for _ in range(PROCESSES)
    ]
    outcomes: list[str] = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outcomes += json.loads(out.strip().splitlines()[-1])
    results = [o for o in outcomes if o.startswith("{")]
    assert len(outcomes) == PROCESSES * CALLERS
    assert sorted(set(outcomes) - set(results)) in ([], ["InProgressError"])  # nothing else
    assert len(set(results)) == 1 and json.loads(results[0])["charged"] == key
    assert len(runs.read_text().splitlines()) == 1  # one execution in all
    assert results  # the one that ran got its result, at least


async def _call_after_kill(
    store: StoreURL, face: Face, tmp_path: Path, killed: list[Any], *, commit: bool
) -> tuple[Any, float, list[str]]:
    key = f"order-{uuid.uuid4().hex}"
    ready = tmp_path / "ready"
    args = ["hold", store.url, face.kind, key, str(ready)] + (["commit"] if commit else [])
    proc = worker(*args)
    killed.append(proc)
    wait_for(ready, proc)
    proc.kill()
    proc.wait(timeout=30)
    killed_at = time.monotonic()
    runs: list[str] = []

    def charge(order_id: str) -> str:
        runs.append(order_id)
        return f"charged {order_id}"

    # Waiting (not rejecting) while the store still sees the owner: the retry goes through as
    # soon as the dead owner is noticed, long before the 30 s lease ends.
    fn = face.define(
        charge, store=store.url, key="order_id", name=NAME, on_conflict="wait", conflict_wait=20.0
    )
    try:
        try:
            outcome: Any = await face.call(fn, key)
        except Exception as exc:
            outcome = exc
    finally:
        await face.close(fn)
    return outcome, time.monotonic() - killed_at, runs


async def test_a_sigkilled_callers_key_is_taken_over_at_once(
    shared_store: StoreURL, face: Face, tmp_path: Path, killed: list[Any]
) -> None:
    outcome, took, runs = await _call_after_kill(shared_store, face, tmp_path, killed, commit=False)
    assert outcome == f"charged {runs[0]}" and len(runs) == 1
    assert took < TAKEOVER_BOUND[shared_store.id]


async def test_a_sigkilled_caller_after_mark_committed_leaves_the_outcome_unknown(
    shared_store: StoreURL, face: Face, tmp_path: Path, killed: list[Any]
) -> None:
    outcome, took, runs = await _call_after_kill(shared_store, face, tmp_path, killed, commit=True)
    assert isinstance(outcome, OutcomeUnknownError), outcome
    assert runs == []  # never run again
    assert took < TAKEOVER_BOUND[shared_store.id]


async def test_a_paused_caller_that_lost_its_lease_cannot_overwrite_the_takers_result(
    shared_store: StoreURL, face: Face, tmp_path: Path, killed: list[Any]
) -> None:
    # Fencing: A is paused (SIGSTOP) past its 1.5 s lease, B takes the key over and stores its
    # result; A resumes and finishes, but its completion is refused (its token no longer holds
    # the key): every later call gets B's result.
    key = f"order-{uuid.uuid4().hex}"
    ready = tmp_path / "ready"
    proc = worker("pause", shared_store.url, face.kind, key, str(ready), "1.5")
    killed.append(proc)
    wait_for(ready, proc)
    proc.send_signal(signal.SIGSTOP)
    await asyncio.sleep(3.0)  # past the lease, even if a renewal landed just before the pause

    def charge(order_id: str) -> str:
        return "second"

    fn = face.define(charge, store=shared_store.url, key="order_id", name=NAME, lease=1.5)
    try:
        assert await face.call(fn, key) == "second"
        proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=60)
        assert json.loads(out.strip().splitlines()[-1]) == "first", err  # it ran, unstored
        assert "lease taken over" in err
        assert await face.call(fn, key) == "second"
    finally:
        await face.close(fn)
