"""OrderHub on Flask as a real multi-process server (``retrysafe demo --framework flask``: gunicorn,
several worker processes): 50 concurrent same-key POSTs give one order; two servers sharing one
store give one order; a SIGKILLed worker's request retried gives exactly one order; bad keys,
1 MiB + 1 bodies and non-JSON bodies never give a 500."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from retrysafe._core.keys import record_id
from retrysafe.stores import store_from_url

from ..conftest import RUN_ID
from ..stores.backend_postgres import admin_connect, fresh_table_url, with_options
from ..stores.backend_redis import delete_prefixed, unique_prefix, with_prefix
from .servers import DemoServer

pytestmark = pytest.mark.e2e

FLASK = ("--framework", "flask")
ORDER = {"item": "espresso machine", "quantity": 1}
LEASE = 1.5
MIB = 1024 * 1024


def _key() -> dict[str, str]:
    return _header(str(uuid.uuid4()))


def _header(key: str) -> dict[str, str]:
    return {"Idempotency-Key": f'"{key}"'}


def _workers(master: int) -> list[int]:
    """The pids of the gunicorn master's worker processes (its children, from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split after its ')'.
        if int(stat.rsplit(")", 1)[1].split()[1]) == master:
            found.append(int(entry))
    return found


def _count(server: DemoServer) -> int:
    count: int = httpx.get(server.url + "/orders", timeout=10).json()["count"]
    return count


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoServer]:
    """One Flask OrderHub on the default SQLite store (transactional), shared by the tests that
    count their own orders."""
    tmp = tmp_path_factory.mktemp("flask-hub")
    server = DemoServer(
        f"sqlite:///{tmp}/store.db", log_dir=tmp / "logs", extra_args=FLASK, lease=LEASE
    ).start()
    yield server
    server.stop()


def _start(store: str, tmp_path: Path, db: str | None = None) -> DemoServer:
    return DemoServer(store, db=db, log_dir=tmp_path / "logs", extra_args=FLASK, lease=LEASE)


async def _post_many(urls: list[str], headers: dict[str, str], count: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        return await asyncio.gather(
            *(
                client.post(urls[i % len(urls)] + "/orders", json=ORDER, headers=headers)
                for i in range(count)
            )
        )


def _assert_one_logical_order(responses: list[httpx.Response]) -> None:
    assert {r.status_code for r in responses} <= {201, 409}, [r.status_code for r in responses]
    created = [r for r in responses if r.status_code == 201]
    firsts = [r for r in created if r.headers.get("idempotency-replayed") != "true"]
    assert len(firsts) == 1
    for replay in created:  # every replay is the first answer, byte for byte
        assert replay.content == firsts[0].content
        assert replay.headers["location"] == firsts[0].headers["location"]
    for conflict in (r for r in responses if r.status_code == 409):
        assert conflict.headers["content-type"] == "application/problem+json"
        assert int(conflict.headers["retry-after"]) >= 1


def test_the_server_runs_several_worker_processes(hub: DemoServer) -> None:
    assert hub.proc is not None
    deadline = time.monotonic() + 15  # gunicorn boots its workers one after the other
    while len(_workers(hub.proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(_workers(hub.proc.pid)) >= 2


def test_50_concurrent_posts_with_one_key_make_one_order(hub: DemoServer) -> None:
    before = _count(hub)
    responses = asyncio.run(_post_many([hub.url], _key(), 50))
    _assert_one_logical_order(responses)
    assert _count(hub) == before + 1


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str | None]]:
    """(store URL, orders --db URL) that two servers share."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/shared.db", None  # orders in the store's file: transactional
    elif request.param == "postgres":
        store = fresh_table_url(request)
        schema = f"rs_test_{RUN_ID}_flask_{uuid.uuid4().hex[:6]}"
        # The orders in this test's own schema of the store's database: transactional mode.
        yield store, with_options(store.split("?", 1)[0], schema=schema)
        with admin_connect(store) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    else:
        base: str = request.getfixturevalue("redis_url")
        prefix = unique_prefix("flask-e2e")
        yield with_prefix(base, prefix), f"sqlite:///{tmp_path}/orders.db"  # mark_committed
        delete_prefixed(base, prefix)


def test_two_servers_sharing_one_store_make_one_order(
    shared: tuple[str, str | None], tmp_path: Path
) -> None:
    store, db = shared
    servers = [_start(store, tmp_path, db) for _ in range(2)]
    try:
        for server in servers:
            server.start()
        headers = {**_key(), "Authorization": "Bearer alice"}
        responses = asyncio.run(_post_many([s.url for s in servers], headers, 20))
        _assert_one_logical_order(responses)
        assert _count(servers[0]) == 1
        assert _count(servers[1]) == 1
        created = next(r for r in responses if r.status_code == 201)
        order = httpx.get(servers[1].url + created.headers["location"], timeout=10).json()
        assert order["owner"] == "alice"
    finally:
        for server in servers:
            server.stop()


def _kill_workers_mid_request(server: DemoServer, url: str, key: str) -> None:
    """Send a slow keyed POST, wait until its record is in progress in the store, then SIGKILL
    every worker process of the server, the one running the request included."""
    assert server.proc is not None
    rid = record_id("", "POST", "/orders", key)
    store = store_from_url(server.store)
    try:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(httpx.post, url, json=ORDER, headers=_header(key), timeout=30)
            deadline = time.monotonic() + 10
            while (record := store.get(rid)) is None and time.monotonic() < deadline:
                time.sleep(0.01)
            assert record is not None and record.state == "in_progress"
            time.sleep(0.3)  # the order is written (delay_after_ms: the view waits after it)
            for pid in _workers(server.proc.pid):
                os.kill(pid, signal.SIGKILL)
            with pytest.raises(httpx.TransportError):
                first.result()
    finally:
        store.close()


def _retry_until_settled(url: str, headers: dict[str, str], seconds: float) -> httpx.Response:
    """Retry (bounded by ``seconds``) while the answer is "in progress" or the master is still
    booting new workers; return the first other answer (or the last 409)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            retry = httpx.post(url, json=ORDER, headers=headers, timeout=30)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
        else:
            settled = retry.status_code != 409 or "outcome-unknown" in retry.text
            if settled or time.monotonic() > deadline:
                return retry
        time.sleep(0.1)


def test_a_sigkilled_worker_mid_request_then_a_retry_gives_exactly_one_order(
    hub: DemoServer,
) -> None:
    # Transactional mode (SQLite): the order and its record commit together or not at all.
    # Killed between the write and the answer, neither is there; after the lease the retry runs.
    before = _count(hub)
    url = hub.url + "/orders?delay_after_ms=1000"
    key = str(uuid.uuid4())
    headers = _header(key)
    _kill_workers_mid_request(hub, url, key)
    assert _count(hub) == before  # the killed request's write was rolled back
    retry = _retry_until_settled(url, headers, LEASE + 15)
    assert retry.status_code == 201, retry.text
    assert "idempotency-replayed" not in retry.headers
    replay = httpx.post(url, json=ORDER, headers=headers, timeout=30)
    assert replay.headers["idempotency-replayed"] == "true"
    assert replay.content == retry.content
    assert _count(hub) == before + 1


def test_a_sigkilled_worker_after_its_effect_on_redis_never_runs_twice(
    redis_url: str, tmp_path: Path
) -> None:
    # Redis cannot commit with the orders: the view marks its effect committed right after the
    # write, so the retry of a request killed after it is "outcome unknown", never a 2nd order.
    prefix = unique_prefix("flask-kill")
    server = _start(with_prefix(redis_url, prefix), tmp_path, f"sqlite:///{tmp_path}/orders.db")
    try:
        server.start()
        url = server.url + "/orders?delay_after_ms=1000"
        key = str(uuid.uuid4())
        headers = _header(key)
        _kill_workers_mid_request(server, url, key)
        assert _count(server) == 1
        retry = _retry_until_settled(url, headers, LEASE + 15)
        assert retry.status_code == 409
        assert retry.json()["type"].endswith("idempotency-outcome-unknown")
        assert _count(server) == 1
    finally:
        server.stop()
        delete_prefixed(redis_url, prefix)


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({"Idempotency-Key": ""}, id="empty-key"),
        pytest.param({"Idempotency-Key": "k" * 256}, id="long-key"),
        pytest.param({"Idempotency-Key": '"unterminated'}, id="bad-sf-string"),
        pytest.param({"Idempotency-Key": "a\tb"}, id="control-char"),
    ],
)
def test_a_bad_key_is_a_400_problem_never_a_500(hub: DemoServer, headers: dict[str, str]) -> None:
    before = _count(hub)
    response = httpx.post(hub.url + "/orders", json=ORDER, headers=headers, timeout=10)
    assert response.status_code == 400
    assert response.json()["type"].endswith("idempotency-key-invalid")
    assert _count(hub) == before


def test_a_key_in_two_header_fields_is_a_400(hub: DemoServer) -> None:
    headers = [("Idempotency-Key", '"a"'), ("Idempotency-Key", '"b"')]
    response = httpx.post(hub.url + "/orders", json=ORDER, headers=headers, timeout=10)
    assert response.status_code == 400


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "no-key"])
def test_a_body_of_1_mib_plus_1_is_never_a_500(hub: DemoServer, keyed: bool) -> None:
    body = b'{"item": "' + b"a" * (MIB + 1 - 12) + b'"}'
    assert len(body) == MIB + 1
    headers = {"Content-Type": "application/json", **(_key() if keyed else {})}
    response = httpx.post(hub.url + "/orders", content=body, headers=headers, timeout=30)
    if keyed:  # over the default limit: nothing runs
        assert response.status_code == 413
        assert response.json()["type"].endswith("idempotency-request-too-large")
    else:  # unprotected: the view itself answers (no quantity), as without the library
        assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"not json at all", id="text"),
        pytest.param(b"\xff\xfe\x00binary", id="binary"),
        pytest.param(b'{"item": "tea", "quantity": 1', id="truncated"),
        pytest.param(b"[1, 2, 3]", id="json-array"),
        pytest.param(b"[" * 100_000, id="deep-nesting"),
    ],
)
def test_a_non_json_body_is_a_4xx_problem_never_a_500_and_a_retry_is_not_stuck(
    hub: DemoServer, body: bytes
) -> None:
    before = _count(hub)
    headers = {"Content-Type": "application/json", **_key()}
    first = httpx.post(hub.url + "/orders", content=body, headers=headers, timeout=10)
    assert first.status_code in (400, 422), first.text
    assert first.headers["content-type"] == "application/problem+json"
    # 400 and 422 are released: the same key with the same bad body runs again, never a 409.
    again = httpx.post(hub.url + "/orders", content=body, headers=headers, timeout=10)
    assert again.status_code == first.status_code
    assert "idempotency-replayed" not in again.headers
    assert _count(hub) == before


def test_the_page_and_the_knobs_work(hub: DemoServer) -> None:
    page = httpx.get(hub.url + "/", timeout=10)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    failed = httpx.post(hub.url + "/orders?fail=1", json=ORDER, headers=_key(), timeout=10)
    assert failed.status_code == 500
    assert failed.headers["content-type"] == "application/problem+json"
    headers = {**_key(), "Authorization": "Bearer bob"}
    paid = httpx.post(
        hub.url + "/payments", json={"amount": 5, "currency": "EUR"}, headers=headers, timeout=10
    )
    assert paid.status_code == 201
    assert paid.headers["location"] == f"/payments/{paid.json()['id']}"
    assert httpx.post(hub.url + "/payments", json={}, timeout=10).status_code == 400
    listing = httpx.get(hub.url + "/payments?limit=0", timeout=10).json()
    assert listing["count"] >= 1 and listing["payments"] == []


def test_a_bad_store_url_fails_at_start_with_one_message(tmp_path: Path) -> None:
    server = _start("cassandra://nowhere", tmp_path)
    with pytest.raises(RuntimeError, match="unknown store URL scheme"):
        server.start()


def test_a_memory_store_is_served_by_one_worker_so_duplicates_still_make_one_order(
    tmp_path: Path,
) -> None:
    server = _start("memory://", tmp_path, f"sqlite:///{tmp_path}/orders.db")
    try:
        server.start()
        assert server.proc is not None
        time.sleep(1.0)  # a second worker, if any, would have booted by now
        assert len(_workers(server.proc.pid)) == 1
        responses = asyncio.run(_post_many([server.url], _key(), 20))
        _assert_one_logical_order(responses)
        assert _count(server) == 1
    finally:
        server.stop()
