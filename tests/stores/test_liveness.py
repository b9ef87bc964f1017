"""Owner liveness across real processes: a key held by a SIGKILLed process is taken over at once
(whatever its lease), a key held by a live process (running, or paused with SIGSTOP) never is, and
a committed record of a dead owner becomes "outcome unknown", never a second run.

The owner is a separate Python process that reserves through the store's URL with a 30 s lease,
prints what it got and waits; the test kills or pauses it and reserves from here.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Iterator

import pytest

from retrysafe.stores import async_store_from_url, store_from_url

from .conftest import Backend

LEASE = 30.0

_OWNER = """
import asyncio, sys
from retrysafe.stores import async_store_from_url, store_from_url
url, key, mode, face = sys.argv[1:5]
if face == "sync":
    store = store_from_url(url)
    got = store.reserve(key, "fp", lease=30.0, ttl=600.0)
    if mode == "commit":
        store.mark_committed(key, got.token, lease=30.0)
    print("held" if got.acquired else "lost", flush=True)
    sys.stdin.read()
else:
    async def main():
        store = async_store_from_url(url)
        got = await store.reserve(key, "fp", lease=30.0, ttl=600.0)
        if mode == "commit":
            await store.mark_committed(key, got.token, lease=30.0)
        print("held" if got.acquired else "lost", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    asyncio.run(main())
"""


class Owner:
    """A process that holds ``key`` in the store at ``url``."""

    def __init__(self, url: str, key: str, *, mode: str = "plain", face: str = "async") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _OWNER, url, key, mode, face],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        assert line == "held", f"owner process did not get the key: {line!r}"

    def kill(self) -> None:
        """SIGKILL, and do not reap: a zombie must count as dead too."""
        self.proc.send_signal(signal.SIGKILL)
        # Wait until the kernel has closed its sockets (state Z), without reaping it.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{self.proc.pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        return
            except FileNotFoundError:
                return
            time.sleep(0.01)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def owners() -> Iterator[list[Owner]]:
    made: list[Owner] = []
    yield made
    for owner in made:
        owner.close()


SHARED = ["sqlite", "postgres", "mysql", "redis", "redis-cluster"]


def _key() -> str:
    return f"live-{uuid.uuid4().hex}"


#: Redis heartbeat TTL in these tests (the default is 5 s; shorter keeps the suite fast).
HEARTBEAT = 1.0


def _url(backend: Backend) -> str:
    """The backend's URL; Redis with a short heartbeat TTL."""
    assert backend.url is not None
    if backend.id.startswith("redis"):
        return f"{backend.url}&heartbeat={HEARTBEAT}"
    return backend.url


async def _reserve_until(url: str, key: str, within: float) -> tuple[bool, float]:
    """Reserve from this process until it wins or ``within`` seconds pass."""
    store = async_store_from_url(url)
    start = time.monotonic()
    try:
        while True:
            got = await store.reserve(key, "fp", lease=LEASE, ttl=600.0)
            elapsed = time.monotonic() - start
            if got.acquired or elapsed > within:
                return got.acquired, elapsed
            await asyncio.sleep(0.05)
    finally:
        await store.aclose()


@pytest.mark.parametrize("backend", SHARED, indirect=True)
@pytest.mark.parametrize("face", ["async", "sync"])
async def test_key_of_a_killed_owner_is_taken_over_at_once(
    backend: Backend, owners: list[Owner], face: str
) -> None:
    url = _url(backend)
    key = _key()
    owner = Owner(url, key, face=face)
    owners.append(owner)
    store = async_store_from_url(url)
    try:
        held = await store.reserve(key, "fp", lease=LEASE, ttl=600.0)
        assert not held.acquired  # alive: the key is its
        assert held.record is not None and held.record.lease_remaining > LEASE - 5
    finally:
        await store.aclose()
    owner.kill()
    # Redis learns of the death when the owner's heartbeat key lapses (its TTL); the others at
    # once. Either way far below the 30 s lease.
    acquired, _ = await _reserve_until(url, key, within=8.0)
    assert acquired


@pytest.mark.parametrize("backend", SHARED, indirect=True)
def test_sync_store_takes_over_a_killed_owners_key(backend: Backend, owners: list[Owner]) -> None:
    url = _url(backend)
    key = _key()
    owner = Owner(url, key)
    owners.append(owner)
    owner.kill()
    store = store_from_url(url)
    try:
        deadline = time.monotonic() + 8.0
        while not (got := store.reserve(key, "fp", lease=LEASE, ttl=600.0)).acquired:
            assert time.monotonic() < deadline, "never taken over"
            time.sleep(0.05)
        # The taker now holds it: a third caller is refused (fencing as any takeover).
        again = store.reserve(key, "fp", lease=LEASE, ttl=600.0)
        assert not again.acquired
        assert store.complete(key, got.token or "", b"done", ttl=600.0)
    finally:
        store.close()


@pytest.mark.parametrize("backend", SHARED, indirect=True)
async def test_committed_record_of_a_killed_owner_is_outcome_unknown(
    backend: Backend, owners: list[Owner]
) -> None:
    url = _url(backend)
    key = _key()
    owner = Owner(url, key, mode="commit")
    owners.append(owner)
    owner.kill()
    store = async_store_from_url(url)
    try:
        deadline = time.monotonic() + 8.0
        while True:
            got = await store.reserve(key, "fp", lease=LEASE, ttl=600.0)
            assert not got.acquired, "a committed record was run again"
            assert got.record is not None and got.record.committed
            if got.record.lease_remaining == 0:
                break
            assert time.monotonic() < deadline, "dead owner's committed record kept its lease"
            await asyncio.sleep(0.05)
    finally:
        await store.aclose()


@pytest.mark.parametrize("backend", SHARED, indirect=True)
async def test_paused_owner_keeps_its_key(backend: Backend, owners: list[Owner]) -> None:
    """SIGSTOP for 2 s (less than the lease), 0.4 s on Redis (its heartbeat TTL here is 1 s,
    refreshed every 0.2 s: 0.4 s leaves room for a refresh that came late on a loaded machine;
    a pause longer than the TTL looks like death there, as the README says): alive."""
    url = _url(backend)
    key = _key()
    owner = Owner(url, key)
    owners.append(owner)
    owner.proc.send_signal(signal.SIGSTOP)
    try:
        pause = HEARTBEAT * 0.4 if backend.id.startswith("redis") else 2.0
        acquired, _ = await _reserve_until(url, key, within=pause)
        assert not acquired
    finally:
        owner.proc.send_signal(signal.SIGCONT)
    acquired, _ = await _reserve_until(url, key, within=0.5)
    assert not acquired


@pytest.mark.parametrize("backend", ["memory"], indirect=True)
def test_memory_store_child_takes_over_its_parents_keys(backend: Backend) -> None:
    """Memory: the owner is the process; a forked child's copy holds its parent's records,
    which only the child can still settle, so it takes them over (committed ones: unknown)."""
    store = backend.sync_store
    plain = store.reserve("plain", "fp", lease=LEASE, ttl=600.0)
    marked = store.reserve("marked", "fp", lease=LEASE, ttl=600.0)
    assert plain.token and marked.token
    assert store.mark_committed("marked", marked.token, lease=LEASE)
    assert not store.reserve("plain", "fp", lease=LEASE, ttl=600.0).acquired
    read, write = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12 warns about fork() in a multi-threaded process; this child only reads
        # and writes the store's dict and a pipe, then exits.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            took = store.reserve("plain", "fp", lease=LEASE, ttl=600.0).acquired
            unknown = store.reserve("marked", "fp", lease=LEASE, ttl=600.0).record
            ok = took and unknown is not None and unknown.lease_remaining == 0
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    os.close(read)
    assert answer == b"1"
    # The parent's own records are still its own.
    assert not store.reserve("plain", "fp", lease=LEASE, ttl=600.0).acquired


def test_tokens_name_their_owner_only_when_marked() -> None:
    from retrysafe._core.records import instance_id, new_owned_token, new_token, token_owner

    assert token_owner(new_owned_token()) == instance_id()
    assert token_owner(new_token()) is None  # a plain token is never judged
    assert token_owner(None) is None
    assert token_owner("short-1") is None


def test_only_another_process_s_owned_token_is_judged() -> None:
    from retrysafe._core.records import lease_token, other_owner

    other = "f" * 24 + "-1"  # another instance's owned token
    assert other_owner(other) == "f" * 24
    assert other_owner(lease_token(owned=True)) is None  # this process: never judged
    assert other_owner(lease_token(owned=False)) is None  # a plain token: never judged
    assert other_owner(None) is None


def test_process_identity_tells_a_live_process_from_a_dead_or_reused_pid() -> None:
    from retrysafe.stores.sqlite._liveness import ProcessIdentity, is_dead, this_process

    here = this_process()
    if here is None:
        pytest.skip("no /proc on this system: every owner is 'unknown' (lease only)")
    assert not is_dead(here, here)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with open(f"/proc/{child.pid}/stat") as f:
            start = int(f.read().rsplit(")", 1)[1].split()[19])
        owner = ProcessIdentity(here.host, child.pid, start)
        assert not is_dead(owner, here)
        child.send_signal(signal.SIGSTOP)
        assert not is_dead(owner, here)  # stopped is alive
        # The same pid with another start time is another process: the owner is gone.
        assert is_dead(ProcessIdentity(here.host, child.pid, start + 1), here)
        # Another host, namespace or boot: nothing can be concluded.
        assert not is_dead(ProcessIdentity("other/host", child.pid, start + 1), here)
        child.kill()
        deadline = time.monotonic() + 5
        while not is_dead(owner, here):  # a zombie (not reaped yet) is dead
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        child.kill()
        child.wait()
    assert is_dead(owner, here)  # reaped: no such pid
