"""Faults around ``retrysafe proxy``, with real processes killed for real: an upstream that dies
holding the request, an upstream that refuses connections, the proxy SIGKILLed mid-request, a
store that is down; and two proxies sharing one Redis or PostgreSQL store."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..e2e.servers import free_port
from ..stores.backend_postgres import fresh_table_url
from ..stores.backend_redis import PrivateRedis, delete_prefixed, unique_prefix, with_prefix
from .conftest import Processes

pytestmark = pytest.mark.e2e


def keyed(key: str) -> dict[str, str]:
    return {"Idempotency-Key": f'"{key}"'}


def slug(response: httpx.Response) -> str:
    assert response.headers["content-type"] == "application/problem+json", response.text
    kind: str = response.json()["type"]
    return kind.rsplit(":", 1)[-1]


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


def resolve(store: str, key: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "retrysafe", "resolve", "--store", store]
    cmd += ["--path", "/orders", "--key", key]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize("language", ["python", "node"])
def test_upstream_killed_holding_the_request_gives_outcome_unknown_never_a_second_forward(
    processes: Processes, store_url: str, language: str
) -> None:
    backend = processes.backend(language=language)
    proxy = processes.proxy(backend.url, store_url)
    key = str(uuid.uuid4())
    url = proxy.url + "/orders?die=1"  # the backend records the effect, then exits unanswered
    with httpx.Client(timeout=10.0) as client:
        first = client.post(url, content=b"pay", headers=keyed(key))
        assert first.status_code == 502
        assert slug(first) == "upstream-no-answer"
        assert backend.exited()  # the request killed it
        backend.start()  # back on the same port: a forward would now reach it
        for _ in range(2):
            retry = client.post(url, content=b"pay", headers=keyed(key))
            assert retry.status_code == 409
            assert slug(retry) == "idempotency-outcome-unknown"
        assert len(backend.effects(key=f'"{key}"')) == 1
        assert backend.alive()  # a second forward of die=1 would have killed it again
        # The operator checks, then frees the key: the next request with it runs.
        done = resolve(store_url, key)
        assert done.returncode == 0, done.stderr
        after = client.post(proxy.url + "/orders", content=b"pay", headers=keyed(key))
        assert after.status_code == 201
        assert "idempotency-replayed" not in after.headers
    assert len(backend.effects(key=f'"{key}"')) == 2


def test_upstream_dying_mid_answer_cuts_the_response_and_leaves_the_outcome_unknown(
    processes: Processes, store_url: str
) -> None:
    backend = processes.backend()
    proxy = processes.proxy(backend.url, store_url)
    key = str(uuid.uuid4())
    url = proxy.url + "/orders?size=400000&cut=1"
    with httpx.Client(timeout=10.0) as client:
        with (
            pytest.raises(httpx.RemoteProtocolError),  # cut off: never a complete 201
            client.stream("POST", url, content=b"c", headers=keyed(key)) as cut,
        ):
            assert cut.status_code == 201
            cut.read()
        backend.start()
        retry = client.post(url, content=b"c", headers=keyed(key))
        assert retry.status_code == 409
        assert slug(retry) == "idempotency-outcome-unknown"
    assert len(backend.effects(key=f'"{key}"')) == 1
    assert "Traceback" not in proxy.log_text()


def test_on_ambiguous_release_frees_the_key_for_idempotent_upstreams(
    processes: Processes, store_url: str
) -> None:
    backend = processes.backend()
    proxy = processes.proxy(backend.url, store_url, "--on-ambiguous", "release")
    key = str(uuid.uuid4())
    with httpx.Client(timeout=10.0) as client:
        first = client.post(proxy.url + "/orders?die=1", content=b"p", headers=keyed(key))
        assert first.status_code == 502
        assert "never forwarded twice" not in first.json()["detail"]
        backend.start()
        retry = client.post(proxy.url + "/orders", content=b"p", headers=keyed(key))
        assert retry.status_code == 201
    assert len(backend.effects(key=f'"{key}"')) == 2


def test_connection_refused_is_502_and_releases_the_key(
    processes: Processes, store_url: str, tmp_path: Path
) -> None:
    port = free_port()
    proxy = processes.proxy(f"http://127.0.0.1:{port}", store_url, "--connect-timeout", "2")
    key = str(uuid.uuid4())
    with httpx.Client(timeout=10.0) as client:
        refused = client.post(proxy.url + "/orders", content=b"o", headers=keyed(key))
        assert refused.status_code == 502
        assert slug(refused) == "upstream-unreachable"
        assert "nothing was sent" in refused.json()["detail"]
        backend = processes.backend(tmp_path / "effects", port=port)
        retry = client.post(proxy.url + "/orders", content=b"o", headers=keyed(key))
        assert retry.status_code == 201
        assert "idempotency-replayed" not in retry.headers
    assert len(backend.effects(key=f'"{key}"')) == 1


async def test_proxy_sigkilled_mid_request_never_forwards_twice(
    processes: Processes, store_url: str
) -> None:
    backend = processes.backend()
    lease = "1"
    doomed = processes.proxy(backend.url, store_url, "--lease", lease)
    key = str(uuid.uuid4())
    url = "/orders?delay_ms=3000"
    async with httpx.AsyncClient(timeout=10.0) as client:
        pending = asyncio.ensure_future(
            client.post(doomed.url + url, content=b"k", headers=keyed(key))
        )
        for _ in range(100):  # until the backend holds it (bounded: 5 s)
            if backend.effects(key=f'"{key}"'):
                break
            await asyncio.sleep(0.05)
        assert backend.effects(key=f'"{key}"')
        doomed.kill()
        with pytest.raises(httpx.TransportError):
            await pending
        survivor = processes.proxy(backend.url, store_url, "--lease", lease)
        answers = []
        deadline = time.monotonic() + 8.0
        while time.monotonic() < deadline:  # in progress until the dead proxy's lease lapses
            answer = await client.post(survivor.url + url, content=b"k", headers=keyed(key))
            answers.append(answer.status_code)
            if answer.status_code != 409 or slug(answer) == "idempotency-outcome-unknown":
                break
            await asyncio.sleep(0.2)
    assert answers[-1] == 409 and slug(answer) == "idempotency-outcome-unknown", answers
    assert set(answers) == {409}
    assert len(backend.effects(key=f'"{key}"')) == 1


def test_store_down_is_503_for_keyed_requests_and_not_ready(processes: Processes) -> None:
    backend = processes.backend()
    dead_store = f"redis://127.0.0.1:{free_port()}/0"
    proxy = processes.proxy(backend.url, dead_store)
    key = str(uuid.uuid4())
    with httpx.Client(timeout=15.0) as client:
        keyed_answer = client.post(proxy.url + "/orders", content=b"d", headers=keyed(key))
        assert keyed_answer.status_code == 503
        assert slug(keyed_answer) == "idempotency-store-unavailable"
        assert int(keyed_answer.headers["retry-after"]) >= 1
        assert backend.effects(key=f'"{key}"') == []
        ready = client.get(proxy.url + "/-/readyz")
        assert ready.status_code == 503
        assert client.get(proxy.url + "/-/healthz").status_code == 200
        # A request without a key needs no store: it is forwarded as usual.
        assert client.post(proxy.url + "/orders", content=b"free").status_code == 201
    assert "Traceback" not in proxy.log_text()


def records(client: Any) -> int:
    """Keys that are records (the owner-liveness heartbeat keys are not)."""
    return sum(1 for name in client.scan_iter() if not name.startswith(b"retrysafe-owner:"))


async def test_a_mark_the_store_cannot_record_keeps_the_request_from_leaving(
    processes: Processes, tmp_path: Path
) -> None:
    import redis

    private = PrivateRedis(tmp_path / "redis").start()
    try:
        backend = processes.backend()
        # One upstream connection: B waits for it after its reservation, before its mark.
        proxy = processes.proxy(backend.url, private.url, "--max-connections", "1")
        a, b = str(uuid.uuid4()), str(uuid.uuid4())
        inspector = redis.Redis(port=private.port)
        async with httpx.AsyncClient(timeout=15.0) as client:
            first = asyncio.ensure_future(
                client.post(proxy.url + "/orders?delay_ms=1500", content=b"a", headers=keyed(a))
            )
            second = None
            for _ in range(100):  # bounded: 5 s
                if second is None and backend.effects(key=f'"{a}"'):
                    second = asyncio.ensure_future(
                        client.post(proxy.url + "/orders", content=b"b", headers=keyed(b))
                    )
                if second is not None and records(inspector) >= 2:
                    break  # B holds its reservation and waits for the connection
                await asyncio.sleep(0.05)
            assert second is not None and records(inspector) >= 2
            inspector.close()
            private.stop()  # the store dies between B's reservation and its mark
            assert (await first).status_code == 201  # already upstream: its answer still comes
            refused = await second
            assert refused.status_code == 503
            assert slug(refused) == "idempotency-store-unavailable"
            assert "not forwarded" in refused.json()["detail"]
            assert backend.effects(key=f'"{b}"') == []
            private.start()
            retry = await client.post(proxy.url + "/orders", content=b"b", headers=keyed(b))
            assert retry.status_code == 201
        assert len(backend.effects(key=f'"{b}"')) == 1
    finally:
        private.stop()


@pytest.fixture(params=["redis", "postgres"])
def network_store(request: pytest.FixtureRequest) -> Iterator[str]:
    """A shared network store under a name of this test's own."""
    if request.param == "redis":
        base: str = request.getfixturevalue("redis_url")
        prefix = unique_prefix("proxy")
        yield with_prefix(base, prefix)
        delete_prefixed(base, prefix)
    else:
        yield fresh_table_url(request)


async def test_two_proxies_on_one_network_store_forward_50_same_key_requests_once(
    processes: Processes, network_store: str
) -> None:
    backend = processes.backend()
    one = processes.proxy(backend.url, network_store)
    two = processes.proxy(backend.url, network_store, "--workers", "2")
    key = str(uuid.uuid4())
    bases = itertools.cycle([one.url, two.url])
    async with httpx.AsyncClient(timeout=20.0, limits=httpx.Limits(max_connections=60)) as c:
        answers = await asyncio.gather(
            *(
                c.post(f"{next(bases)}/orders?delay_ms=300", content=b"1", headers=keyed(key))
                for _ in range(50)
            )
        )
    statuses = [a.status_code for a in answers]
    assert set(statuses) <= {201, 409}, statuses
    assert statuses.count(201) >= 1
    originals = [
        a for a in answers if a.status_code == 201 and "idempotency-replayed" not in a.headers
    ]
    assert len(originals) == 1
    assert len(backend.effects(key=f'"{key}"')) == 1


def script_calls(client: Any) -> int:
    """Script calls the server has run (EVALSHA and EVAL): the store's round trips."""
    stats = client.info("commandstats")
    return sum(stats.get(name, {}).get("calls", 0) for name in ("cmdstat_evalsha", "cmdstat_eval"))


def test_a_new_key_costs_two_redis_round_trips_and_a_replay_one(
    processes: Processes, tmp_path: Path
) -> None:
    """With an idle upstream connection in hand, the reservation is written committed (the
    mark's round trip folded into it): reserve+mark, then complete. The record ends completed,
    and a replay is one read."""
    import redis

    private = PrivateRedis(tmp_path / "redis").start()
    try:
        backend = processes.backend()
        proxy = processes.proxy(backend.url, private.url)
        inspector = redis.Redis(port=private.port)
        with httpx.Client(timeout=10.0) as client:
            # The first request opens the upstream connection (no idle one yet): three trips.
            assert client.post(proxy.url + "/orders", headers=keyed("warm")).status_code == 201
            before = script_calls(inspector)
            keys = [str(uuid.uuid4()) for _ in range(5)]
            for key in keys:
                answer = client.post(proxy.url + "/orders", content=b"n", headers=keyed(key))
                assert answer.status_code == 201 and "idempotency-replayed" not in answer.headers
            after_new = script_calls(inspector)
            for key in keys:
                replay = client.post(proxy.url + "/orders", content=b"n", headers=keyed(key))
                assert replay.headers.get("idempotency-replayed") == "true"
            after_replay = script_calls(inspector)
        assert after_new - before == 2 * len(keys)
        assert after_replay - after_new == len(keys)
        assert all(len(backend.effects(key=f'"{key}"')) == 1 for key in keys)
        inspector.close()
    finally:
        private.stop()
