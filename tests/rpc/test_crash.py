"""A gRPC server killed mid-call (SIGKILL, a real child process): the client's retry with the
same key, sent to a new server over the same store, runs once, after the dead call's lease
(ABORTED with a retry delay until then), and its repeat is a replay. Sync and aio servers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from ..e2e.servers import free_port
from .harness import Outcome, call
from .service import Effects

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


class ServiceProcess:
    """``python -m tests.rpc.service`` on a free port, until killed."""

    def __init__(self, kind: str, store: str, effects: Path, log: Path) -> None:
        self.port = free_port()
        args = [str(self.port), store, str(effects), kind, "--lease", "1"]
        self.log = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.rpc.service", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=self.log,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == b"serving", log.read_text()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def close(self) -> None:
        self.channel.close()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.log.close()


@pytest.mark.parametrize("kind", ["sync", "aio"])
def test_a_server_killed_mid_call_then_the_retry_with_the_same_key_runs_once(
    kind: str, tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path}/idempotency.db"
    effects = Effects(tmp_path / "effects.db")
    hold, entered = tmp_path / "hold", tmp_path / "entered"
    hold.touch()
    request = {"item": "book", "hold_while": str(hold), "entered": str(entered)}
    first = ServiceProcess(kind, store, effects.path, tmp_path / "first.log")
    second: ServiceProcess | None = None
    try:
        lost: list[Outcome] = []
        sender = threading.Thread(target=lambda: lost.append(call(first.channel, request, key="c")))
        sender.start()
        deadline = time.monotonic() + 20
        while not entered.exists():
            assert time.monotonic() < deadline, "the first call never reached the handler"
            time.sleep(0.02)
        first.kill()  # mid-call: the handler waits in hold_while, before its effect
        sender.join(20)
        assert lost[0].code is grpc.StatusCode.UNAVAILABLE  # the client saw the connection die
        hold.unlink()
        second = ServiceProcess(kind, store, effects.path, tmp_path / "second.log")
        refusals = 0
        while True:  # the client's own retry loop, with the same key
            outcome = call(second.channel, request, key="c")
            if outcome.code is not grpc.StatusCode.ABORTED:
                break
            refusals += 1
            assert refusals < 100, "the dead call's key was never taken over"
            time.sleep(min(0.1, int(outcome.trailing["retry-after"])))
        assert outcome.code is grpc.StatusCode.OK and not outcome.replayed
        assert effects.count() == 1
        repeat = call(second.channel, request, key="c")
        assert repeat.replayed and repeat.body == outcome.body
        assert effects.count() == 1
    finally:
        first.close()
        if second is not None:
            second.close()


@pytest.mark.parametrize("kind", ["sync", "aio"])
def test_eight_concurrent_calls_with_one_key_across_two_server_processes_run_once(
    kind: str, tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path}/idempotency.db"
    effects = Effects(tmp_path / "effects.db")
    servers = [
        ServiceProcess(kind, store, effects.path, tmp_path / f"server{n}.log") for n in range(2)
    ]
    try:
        outcomes: list[Outcome] = []
        start = threading.Barrier(8)
        request = {"item": "book", "hold": 0.5}

        def send(n: int) -> None:
            start.wait()
            outcomes.append(call(servers[n % 2].channel, request, key="shared"))

        threads = [threading.Thread(target=send, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        codes = sorted(o.code.name for o in outcomes)
        assert effects.count() == 1, codes
        assert codes.count("OK") >= 1 and set(codes) <= {"OK", "ABORTED"}
        assert len({o.body for o in outcomes if o.code is grpc.StatusCode.OK}) == 1
        for server in servers:  # both processes replay the one outcome
            assert call(server.channel, request, key="shared").replayed
        assert effects.count() == 1
    finally:
        for server in servers:
            server.close()
