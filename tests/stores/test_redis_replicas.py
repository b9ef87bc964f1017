"""Acknowledged writes (``?replicas=N``: ``WAIT`` after the script) and an owner that knows its
own reservation, against real servers: a private master with a replica of its own, a proxy that
loses one reply, and Redis Clusters whose masters are SIGKILLed after their replica was cut off.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from retrysafe import ConfigurationError, StoreUnavailableError
from retrysafe.stores import async_store_from_url, store_from_url
from retrysafe.stores.redis import AsyncRedisStore, RedisStore, parse_redis_url
from retrysafe.stores.redis_cluster import AsyncRedisClusterStore, parse_cluster_url

from ..conftest import RUN_ID, service_missing
from ..e2e.servers import free_port
from .backend_redis import PrivateRedis, unique_prefix, with_prefix
from .cluster import RedisClusterProcs, cluster_binaries
from .test_redis_cluster import _app

FP = "fp"
LEASE = 30.0
TTL = 600.0


# -- the option ----------------------------------------------------------------------------------


def test_replicas_options_from_the_url() -> None:
    parsed = parse_redis_url("redis://h/0?replicas=2&replicas_timeout=0.25")
    assert (parsed.replicas, parsed.replicas_timeout) == (2, 0.25)
    assert "replicas" not in parsed.client_url
    assert parse_redis_url("redis://h").replicas == 0
    cluster = parse_cluster_url("redis+cluster://h:1,h:2?replicas=1")
    assert cluster.options.replicas == 1


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("redis://h?replicas=-1", "replicas"),
        ("redis://h?replicas=one", "replicas"),
        ("redis://h?replicas=1.5", "replicas"),
        ("redis://h?replicas=1&replicas_timeout=0", "replicas_timeout"),
        # A wait as long as the command timeout would be cut off by it.
        ("redis://h?replicas=1&replicas_timeout=2", "replicas_timeout"),
        ("redis+cluster://h:1?replicas=x", "replicas"),
        ("redis://h?replica=1", "replica"),
    ],
)
def test_a_bad_replicas_option_is_a_configuration_error_naming_it(url: str, named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        async_store_from_url(url)
    with pytest.raises(ConfigurationError, match=named):
        store_from_url(url)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"replicas": -1}, "replicas"),
        ({"replicas": "1"}, "replicas"),
        ({"replicas": True}, "replicas"),
        ({"replicas": 1, "replicas_timeout": 0}, "replicas_timeout"),
        ({"replicas": 1, "replicas_timeout": 5.0}, "replicas_timeout"),
    ],
)
def test_a_bad_replicas_keyword_is_a_configuration_error_naming_it(
    kwargs: dict[str, object], named: str
) -> None:
    with pytest.raises(ConfigurationError, match=named):
        AsyncRedisStore("redis://127.0.0.1:1/0", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=named):
        RedisStore("redis://127.0.0.1:1/0", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=named):
        AsyncRedisClusterStore("redis+cluster://127.0.0.1:1", **kwargs)  # type: ignore[arg-type]


def test_the_keyword_overrides_the_url() -> None:
    store = RedisStore("redis://127.0.0.1:1/0?replicas=2", replicas=0)
    try:
        assert store.replicas == 0
    finally:
        store.close()


# -- one server with one replica -----------------------------------------------------------------


class _Replica:
    """A redis-server replicating from ``master`` (its own process, stopped at the end)."""

    def __init__(self, workdir: Path, master: PrivateRedis) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                *(binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""),
                *("--appendonly", "no", "--dir", str(workdir)),
                *("--replicaof", "127.0.0.1", str(master.port)),
                *("--repl-diskless-sync-delay", "0"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        try:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                try:
                    if client.info("replication").get("master_link_status") == "up":
                        return
                except redis.RedisError:
                    pass
                time.sleep(0.05)
        finally:
            client.close()
        self.stop()
        raise RuntimeError("the replica did not link up with its master")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def master_with_replica(tmp_path: Path) -> Iterator[tuple[PrivateRedis, _Replica]]:
    """A private master and one replica of it."""
    master = PrivateRedis(tmp_path / "master").start()
    try:
        replica = _Replica(tmp_path / "replica", master)
        try:
            yield master, replica
        finally:
            if replica.proc.poll() is None:
                os.kill(replica.proc.pid, signal.SIGCONT)
            replica.stop()
    finally:
        master.stop()


def _record(url: str, prefix: str, record_id: str) -> dict[bytes, bytes]:
    client = redis.Redis.from_url(url)
    try:
        return client.hgetall(f"{prefix}{record_id}")  # type: ignore[return-value]
    finally:
        client.close()


async def test_one_replica_acknowledges_or_the_write_fails_closed(
    master_with_replica: tuple[PrivateRedis, _Replica],
) -> None:
    """replicas=1 on one server: with the replica linked every write is acknowledged; with it
    stopped (SIGSTOP) a reservation and a completion fail with StoreUnavailableError after the
    wait; the same process's retry then resumes its own reservation and finishes it."""
    master, replica = master_with_replica
    prefix = unique_prefix("acks")
    url = with_prefix(master.url, prefix) + "&replicas=1&replicas_timeout=0.3"
    store, sync = AsyncRedisStore(url), RedisStore(url)
    unacked = AsyncRedisStore(with_prefix(master.url, prefix))
    try:
        won = await store.reserve("a", FP, lease=LEASE, ttl=TTL)
        assert won.token and await store.complete("a", won.token, b"A", ttl=TTL)
        sync_won = sync.reserve("s", FP, lease=LEASE, ttl=TTL)
        assert sync_won.token and sync.complete("s", sync_won.token, b"S", ttl=TTL)
        replica_client = redis.Redis(port=replica.port)
        assert replica_client.hget(f"{prefix}a", "r") == b"A"
        assert replica_client.hget(f"{prefix}s", "r") == b"S"
        replica_client.close()

        held = await store.reserve("held", FP, lease=LEASE, ttl=TTL)
        os.kill(replica.proc.pid, signal.SIGSTOP)
        try:
            # Without the option the same server answers at once: nothing waits.
            assert (await unacked.reserve("plain", FP, lease=LEASE, ttl=TTL)).token
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError, match="replicas"):
                await store.reserve("b", FP, lease=LEASE, ttl=TTL)
            assert time.monotonic() - started >= 0.25
            with pytest.raises(StoreUnavailableError, match="replicas"):
                sync.reserve("t", FP, lease=LEASE, ttl=TTL)
            assert held.token
            with pytest.raises(StoreUnavailableError, match="replicas"):
                await store.complete("held", held.token, b"H", ttl=TTL)
            # The master did run the script: the reservation is there, unacknowledged.
            assert _record(master.url, prefix, "b")[b"s"] == b"0"
        finally:
            os.kill(replica.proc.pid, signal.SIGCONT)

        # The retry from this process resumes its own reservation (not "in progress").
        again = await store.reserve("b", FP, lease=LEASE, ttl=TTL)
        assert again.token == _record(master.url, prefix, "b")[b"t"].decode()
        sync_again = sync.reserve("t", FP, lease=LEASE, ttl=TTL)
        assert sync_again.token
        # Another process meets it in progress, as it should.
        other = await unacked.reserve("b", FP, lease=LEASE, ttl=TTL)
        assert other.token is None and other.record is not None
        # The completion sent again is the same completion: done, now acknowledged.
        assert await store.complete("held", held.token, b"H", ttl=TTL)
        assert not await store.complete("held", held.token, b"other", ttl=TTL)
        assert await store.complete("b", again.token or "", b"B", ttl=TTL)
        assert sync.complete("t", sync_again.token, b"T", ttl=TTL)
    finally:
        await store.aclose()
        await unacked.aclose()
        sync.close()


# -- a lost reply --------------------------------------------------------------------------------


class _ReplyDropper:
    """A TCP proxy to Redis that, when told, swallows the next reply and closes the client's
    connection: the command ran, its caller never hears."""

    def __init__(self, port: int) -> None:
        self.upstream = port
        self.drop = threading.Event()
        self.dropped = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, replies: bool) -> None:
        try:
            while data := source.recv(65536):
                if replies and self.drop.is_set():
                    self.drop.clear()
                    self.dropped.set()
                    break
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def dropper(redis_url: str) -> Iterator[_ReplyDropper]:
    port = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs["port"]
    proxy = _ReplyDropper(int(port))
    yield proxy
    proxy.close()


async def test_a_reservation_whose_reply_was_lost_is_resumed_by_its_owner(
    redis_url: str, dropper: _ReplyDropper
) -> None:
    """The reserve ran on Redis but its reply was lost (the connection dropped): the owner's
    retry wins its own reservation at once, both faces, while another store (another process)
    meets it in progress; no lease-long wait."""
    prefix = unique_prefix("lost")
    url = f"redis://127.0.0.1:{dropper.port}/0?prefix={prefix}&heartbeat=0"
    direct = AsyncRedisStore(with_prefix(redis_url, prefix) + "&heartbeat=0")
    store, sync = AsyncRedisStore(url), RedisStore(url)
    try:
        assert await store.get("warm") is None and sync.get("warm") is None
        for name, reserve in (
            ("async", lambda: store.reserve("k-async", FP, lease=LEASE, ttl=TTL)),
            ("sync", lambda: asyncio.to_thread(sync.reserve, "k-sync", FP, lease=LEASE, ttl=TTL)),
        ):
            dropper.dropped.clear()
            dropper.drop.set()
            with pytest.raises(StoreUnavailableError):
                await reserve()
            assert dropper.dropped.is_set(), name
            record_id = f"k-{name}"
            stored = _record(redis_url, prefix, record_id)
            assert stored[b"s"] == b"0", "the reservation did land"
            # Another process: in progress, with the lease nearly whole.
            other = await direct.reserve(record_id, FP, lease=LEASE, ttl=TTL)
            assert other.token is None and other.record is not None
            assert other.record.lease_remaining > LEASE - 5
            started = time.monotonic()
            again = await reserve()
            assert again.token == stored[b"t"].decode(), name
            assert time.monotonic() - started < 2
        # A different request with the key is not handed the lost token.
        dropper.drop.set()
        with pytest.raises(StoreUnavailableError):
            await store.reserve("k-fp", FP, lease=LEASE, ttl=TTL)
        other_fp = await store.reserve("k-fp", "another", lease=LEASE, ttl=TTL)
        assert other_fp.token is None and other_fp.record is not None
        assert (await store.reserve("k-fp", FP, lease=LEASE, ttl=TTL)).token
    finally:
        await store.aclose()
        await direct.aclose()
        sync.close()


# -- a cluster whose master dies after its replica was cut off -----------------------------------


def _cluster(tmp_path: Path) -> RedisClusterProcs:
    if cluster_binaries() is None:
        service_missing("redis-server / redis-cli", "not on PATH (Debian: redis-server)")
    return RedisClusterProcs(tmp_path / "cluster").start()


def _kill_cut_off_master(procs: RedisClusterProcs, master: int, replica: int) -> None:
    """Cut the replica off, SIGKILL the master 0.5 s later, wait for the replica to take over,
    then bring the old master back as a replica and wait for a whole cluster again."""
    procs.cut_off(replica)
    time.sleep(0.5)
    procs.procs[master].kill()
    procs.procs[master].wait(timeout=10)
    deadline = time.monotonic() + 30
    while "role:master" not in procs.call(replica, "info", "replication"):
        if time.monotonic() > deadline:
            raise AssertionError(f"replica {replica} never took over from {master}")
        time.sleep(0.05)
    procs.reconnect(replica)
    procs.restart(master)
    procs.wait_ok(timeout=60)


async def _failover_run(
    procs: RedisClusterProcs, replicas: int, kills: int, workers: int = 4
) -> tuple[Counter[str], list[str], Counter[int]]:
    """New keys through the middleware while ``kills`` masters die, each after its replica was
    cut off; then every key once more (a late pass: a lost record runs again). Returns the
    effects per key, the keys and the statuses."""
    prefix = f"rs-acks-{RUN_ID}-{uuid.uuid4().hex[:8]}:"
    url = f"redis+cluster://{procs.seeds}?prefix={prefix}&replicas={replicas}"
    effects: Counter[str] = Counter()
    app, store = _app(url, effects)
    statuses: Counter[int] = Counter()
    keys: list[str] = []
    running = True

    async def until_answered(client: httpx.AsyncClient, key: str) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            response = await client.post("/orders", content=b"{}", headers={"Idempotency-Key": key})
            statuses[response.status_code] += 1
            if response.status_code == 201:
                return
            assert response.status_code in (409, 503), response.text
            await asyncio.sleep(0.05)
        raise AssertionError(f"{key} never answered 201")

    async def worker(client: httpx.AsyncClient) -> None:
        while running:
            key = f"op-{len(keys)}-{uuid.uuid4().hex}"
            keys.append(key)
            await until_answered(client, key)

    async def kill_masters() -> None:
        nonlocal running
        try:
            for _ in range(kills):
                await asyncio.sleep(1.0)
                roles = await asyncio.to_thread(procs.masters_and_replicas)
                master = next(p for p, r in roles.items() if r)
                await asyncio.to_thread(_kill_cut_off_master, procs, master, roles[master][0])
            await asyncio.sleep(1.0)
        finally:
            running = False

    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            await asyncio.gather(kill_masters(), *(worker(client) for _ in range(workers)))
            # The late pass: every key again, until answered (a completion still being
            # retried after the failover answers 409 meanwhile).
            pending = list(keys)
            while pending:
                batch, pending = pending[:16], pending[16:]
                await asyncio.gather(*(until_answered(client, key) for key in batch))
    finally:
        await store.aclose()
    return effects, keys, statuses


def _duplicates(effects: Counter[str]) -> int:
    return sum(n - 1 for n in effects.values() if n > 1)


@pytest.mark.usefixtures("dropped_cluster_nodes")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.timeout(300)
async def test_acknowledged_writes_survive_a_master_killed_with_its_replica_cut_off(
    tmp_path: Path,
) -> None:
    """replicas=1: a master SIGKILLed 0.5 s after its replica was cut off loses nothing that was
    answered: no key runs twice and every key ran once."""
    procs = _cluster(tmp_path)
    try:
        effects, keys, statuses = await _failover_run(procs, replicas=1, kills=1)
    finally:
        procs.stop()
    print(f"\nreplicas=1, 1 kill: {len(keys)} keys, {dict(statuses)}")
    assert _duplicates(effects) == 0, [k for k, n in effects.items() if n > 1]
    assert set(effects) == set(keys) and set(effects.values()) == {1}
    assert statuses[503] > 0, "the cut-off shard's writes should have been refused"


@pytest.mark.usefixtures("dropped_cluster_nodes")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.chaos
@pytest.mark.timeout(900)
@pytest.mark.parametrize("replicas", [0, 1])
async def test_four_masters_killed_with_their_replicas_cut_off(
    tmp_path: Path, replicas: int
) -> None:
    """Four master SIGKILLs, each 0.5 s after its replica was cut off. Without replicas= the
    records the master acknowledged in that window are lost and their keys run again (counted
    and printed, the figure the stores guide gives); with replicas=1, none."""
    procs = _cluster(tmp_path)
    try:
        effects, keys, statuses = await _failover_run(procs, replicas=replicas, kills=4)
    finally:
        procs.stop()
    duplicates = _duplicates(effects)
    print(
        f"\nreplicas={replicas}, 4 kills: {len(keys)} keys, {dict(statuses)}, "
        f"duplicates={duplicates}"
    )
    assert set(effects) == set(keys)
    if replicas:
        assert duplicates == 0, [k for k, n in effects.items() if n > 1]
        assert set(effects.values()) == {1}


async def test_concurrent_writes_share_one_wait(
    master_with_replica: tuple[PrivateRedis, _Replica],
) -> None:
    """The async store's writes sent together are followed by one WAIT, not one each (a WAIT
    blocks its connection on the server until the replica answers)."""
    master, _ = master_with_replica
    store = AsyncRedisStore(with_prefix(master.url, unique_prefix("batch")) + "&replicas=1")
    client = redis.Redis.from_url(master.url)
    try:
        await store.reserve("warm", FP, lease=LEASE, ttl=TTL)
        client.config_resetstat()
        won = await asyncio.gather(
            *(store.reserve(f"k{i}", FP, lease=LEASE, ttl=TTL) for i in range(50))
        )
        assert all(r.token for r in won)
        stats = client.info("commandstats")
        assert stats["cmdstat_evalsha"]["calls"] == 50
        assert stats["cmdstat_wait"]["calls"] < 10
    finally:
        client.close()
        await store.aclose()


def _on_replica(port: int, key: str) -> bytes | None:
    client = redis.Redis(port=port, single_connection_client=True)
    try:
        client.execute_command("READONLY")
        value: bytes | None = client.hget(key, "s")  # type: ignore[assignment]
        return value
    finally:
        client.close()


@pytest.mark.usefixtures("dropped_cluster_nodes")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_cluster_writes_are_acknowledged_and_follow_a_moved_slot(
    redis_cluster: RedisClusterProcs,
) -> None:
    """replicas=1 on a cluster, both faces: each write is on the slot master's replica when it
    returns, and after a planned failover (the store's slot map now stale: MOVED) the next
    write follows the slot to its new master."""
    from .test_redis_cluster import _fail_over

    prefix = f"rs-acks-{RUN_ID}-{uuid.uuid4().hex[:8]}:"
    url = f"redis+cluster://{redis_cluster.seeds}?prefix={prefix}&replicas=1"
    store = AsyncRedisClusterStore(url)
    sync = store_from_url(url)
    probe = redis.cluster.RedisCluster(host="127.0.0.1", port=redis_cluster.ports[0])
    try:
        for name, reserve, complete in (
            ("a", store.reserve, store.complete),
            ("s", lambda *a, **k: asyncio.to_thread(sync.reserve, *a, **k), None),
        ):
            won = await reserve(name, FP, lease=LEASE, ttl=TTL)
            assert won.token
            if complete is not None:
                assert await complete(name, won.token, b"r", ttl=TTL)
            else:
                assert sync.complete(name, won.token, b"r", ttl=TTL)
            master = probe.get_node_from_key(f"{prefix}{name}").port
            replica = redis_cluster.masters_and_replicas()[master][0]
            assert _on_replica(replica, f"{prefix}{name}") == b"1"
        # Move the slot of "m" to its replica; the stores still route it to the old master.
        key = f"{prefix}m"
        master = probe.get_node_from_key(key).port
        replica = redis_cluster.masters_and_replicas()[master][0]
        await asyncio.to_thread(_fail_over, redis_cluster, master, replica)
        won = await store.reserve("m", FP, lease=LEASE, ttl=TTL)
        assert won.token and await store.complete("m", won.token, b"r", ttl=TTL)
        # The sync store's map is stale too: it meets the completed record on the new master.
        again = await asyncio.to_thread(sync.reserve, "m", FP, lease=LEASE, ttl=TTL)
        assert again.record is not None and again.record.response == b"r"
        await asyncio.to_thread(redis_cluster.wait_ok)
    finally:
        probe.close()
        await store.aclose()
        sync.close()
