"""The wire contract through real ``retrysafe proxy`` processes in front of a backend that has no
idempotency at all, in Python (``backend.py``) and in Node.js (``backend.js``), each a separate
process that counts every effect it performs."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .conftest import Backend, Processes, Proxy

pytestmark = pytest.mark.e2e

CONFIG = """
max_body_size = 65536
max_stored_body_size = 65536
upstream_timeout = 1.5

[[routes]]
path = "/payments"
required = true
ttl = 3600

[[routes]]
path = "/orders/bulk*"
enabled = false
"""


@pytest.fixture(scope="module", params=["python", "node"])
def backend(module_processes: Processes, request: pytest.FixtureRequest) -> Iterator[Backend]:
    started = module_processes.backend(language=request.param)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def store_url(module_processes: Processes, backend: Backend) -> str:
    return f"sqlite:///{module_processes.log_dir.parent / f'store-{backend.language}.db'}"


@pytest.fixture(scope="module")
def proxy(module_processes: Processes, backend: Backend, store_url: str) -> Iterator[Proxy]:
    """One worker; options from flags and the TOML file."""
    config = module_processes.log_dir.parent / "proxy.toml"
    config.write_text(CONFIG)
    started = module_processes.proxy(backend.url, store_url, "--config", str(config))
    yield started
    started.stop()


@pytest.fixture(scope="module")
def trusting_proxy(
    module_processes: Processes, backend: Backend, store_url: str
) -> Iterator[Proxy]:
    """Two uvicorn workers on the same store; upstream and trust from RETRYSAFE_* variables."""
    env = {"RETRYSAFE_UPSTREAM": backend.url, "RETRYSAFE_TRUST_FORWARDED": "true"}
    started = module_processes.proxy(backend.url, store_url, "--workers", "2", env=env)
    yield started
    started.stop()


def new_key() -> str:
    return str(uuid.uuid4())


def keyed(key: str, **headers: str) -> dict[str, str]:
    return {"Idempotency-Key": f'"{key}"', **headers}


def problem_type(response: httpx.Response) -> str:
    assert response.headers["content-type"] == "application/problem+json", response.text
    kind: str = response.json()["type"]
    return kind.rsplit(":", 1)[-1]


def test_replay_returns_the_first_answer_and_the_backend_runs_once(
    proxy: Proxy, backend: Backend, client: httpx.Client
) -> None:
    key = new_key()
    first = client.post(proxy.url + "/orders", content=b'{"item":"tea"}', headers=keyed(key))
    assert first.status_code == 201
    assert first.headers["location"] == f"/orders/{first.json()['id']}"
    again = client.post(proxy.url + "/orders", content=b'{"item":"tea"}', headers=keyed(key))
    assert again.status_code == 201
    assert again.headers["idempotency-replayed"] == "true"
    assert again.content == first.content
    assert again.headers["location"] == first.headers["location"]
    assert len(backend.effects(key=f'"{key}"')) == 1


def test_same_key_with_another_body_is_422_and_not_forwarded(
    proxy: Proxy, backend: Backend, client: httpx.Client
) -> None:
    key = new_key()
    assert client.post(proxy.url + "/orders", content=b"a", headers=keyed(key)).status_code == 201
    other = client.post(proxy.url + "/orders", content=b"b", headers=keyed(key))
    assert other.status_code == 422
    assert problem_type(other) == "idempotency-key-reused"
    assert [e["body"] for e in backend.effects(key=f'"{key}"')] == ["a"]


async def test_same_key_while_the_first_is_upstream_is_409_with_retry_after(
    proxy: Proxy, backend: Backend
) -> None:
    key = new_key()
    url = proxy.url + "/orders?delay_ms=800"
    async with httpx.AsyncClient(timeout=10.0) as c:
        first = asyncio.ensure_future(c.post(url, content=b"x", headers=keyed(key)))
        for _ in range(100):  # until the backend has it (bounded: 5 s)
            if backend.effects(key=f'"{key}"'):
                break
            await asyncio.sleep(0.05)
        second = await c.post(url, content=b"x", headers=keyed(key))
        assert (await first).status_code == 201
    assert second.status_code == 409
    assert problem_type(second) == "idempotency-request-in-progress"
    assert int(second.headers["retry-after"]) >= 1
    assert len(backend.effects(key=f'"{key}"')) == 1


def test_route_policy_from_the_config_file(
    proxy: Proxy, backend: Backend, client: httpx.Client
) -> None:
    missing = client.post(proxy.url + "/payments", content=b'{"amount":5}')
    assert missing.status_code == 400
    assert problem_type(missing) == "idempotency-key-missing"
    assert backend.effects(path="/payments") == []
    # Elsewhere the key stays optional: without one, every request runs.
    body = uuid.uuid4().hex.encode()
    for _ in range(2):
        assert client.post(proxy.url + "/orders", content=body).status_code == 201
    assert len(backend.effects(body=body.decode())) == 2
    # enabled = false: no idempotency at all under /orders/bulk*, even with a key.
    key = new_key()
    for _ in range(2):
        answer = client.post(proxy.url + "/orders/bulk", content=b"y", headers=keyed(key))
        assert answer.status_code == 201
        assert "idempotency-replayed" not in answer.headers
    assert len(backend.effects(key=f'"{key}"')) == 2


def test_keyed_body_over_the_limit_is_413_and_never_forwarded(
    proxy: Proxy, backend: Backend, client: httpx.Client
) -> None:
    key = new_key()
    answer = client.post(proxy.url + "/orders", content=b"z" * 70_000, headers=keyed(key))
    assert answer.status_code == 413
    assert problem_type(answer) == "idempotency-request-too-large"
    assert backend.effects(key=f'"{key}"') == []


def test_keys_are_scoped_by_the_principal_header(
    proxy: Proxy, backend: Backend, client: httpx.Client
) -> None:
    key = new_key()
    answers = {}
    for user in ("alice", "bob", "alice"):
        headers = keyed(key, Authorization=f"Bearer {user}")
        answers.setdefault(user, []).append(
            client.post(proxy.url + "/orders", content=b"same", headers=headers)
        )
    alice, bob = answers["alice"], answers["bob"]
    assert alice[0].json()["id"] != bob[0].json()["id"]
    assert alice[1].headers["idempotency-replayed"] == "true"
    assert alice[1].content == alice[0].content
    effects = backend.effects(key=f'"{key}"')
    assert sorted(e["authorization"] for e in effects) == ["Bearer alice", "Bearer bob"]


def test_api_keys_that_differ_only_in_case_never_share_a_record(
    module_processes: Processes, backend: Backend, store_url: str, client: httpx.Client
) -> None:
    by_api_key = module_processes.proxy(backend.url, store_url, "--principal-header", "X-Api-Key")
    try:
        key = new_key()
        url = by_api_key.url + "/orders"
        first = client.post(url, content=b"t", headers=keyed(key, **{"X-Api-Key": "KeyAbC-x"}))
        other = client.post(url, content=b"t", headers=keyed(key, **{"X-Api-Key": "keyabc-x"}))
    finally:
        by_api_key.stop()
    assert first.status_code == other.status_code == 201
    assert "idempotency-replayed" not in other.headers  # forwarded, not the first tenant's 201
    assert len(backend.effects(key=f'"{key}"')) == 2


def test_a_bare_authorization_token_is_compared_exactly(
    proxy: Proxy, backend: Backend, client: httpx.Client
) -> None:
    key = new_key()
    first = client.post(
        proxy.url + "/orders", content=b"b", headers=keyed(key, Authorization="KeyAbC-x")
    )
    other = client.post(
        proxy.url + "/orders", content=b"b", headers=keyed(key, Authorization="keyabc-x")
    )
    same = client.post(
        proxy.url + "/orders", content=b"b", headers=keyed(key, Authorization="KeyAbC-x")
    )
    assert "idempotency-replayed" not in other.headers
    assert same.headers["idempotency-replayed"] == "true" and same.content == first.content
    assert len(backend.effects(key=f'"{key}"')) == 2


@pytest.mark.parametrize(
    ("one", "other"),
    [("/orders/a%2Fb", "/orders/a/b"), ("/orders/x%FF", "/orders/x%FE")],
    ids=["encoded-slash", "invalid-utf8"],
)
def test_raw_paths_the_upstream_tells_apart_never_share_a_record(
    proxy: Proxy, backend: Backend, one: str, other: str
) -> None:
    key = new_key()
    with httpx.Client(timeout=10.0) as raw_client:
        first = raw_client.post(httpx.URL(proxy.url + one), content=b"p", headers=keyed(key))
        second = raw_client.post(httpx.URL(proxy.url + other), content=b"p", headers=keyed(key))
        again = raw_client.post(httpx.URL(proxy.url + one), content=b"p", headers=keyed(key))
    assert first.status_code == second.status_code == 201
    assert "idempotency-replayed" not in second.headers
    assert again.headers["idempotency-replayed"] == "true" and again.content == first.content
    paths = sorted(e["path"] for e in backend.effects(key=f'"{key}"'))
    assert paths == sorted([one, other])  # the upstream got each raw path, once


def test_repeated_query_values_in_another_order_are_another_request(
    proxy: Proxy, backend: Backend, client: httpx.Client
) -> None:
    key = new_key()
    url = proxy.url + "/orders"
    first = client.post(url + "?a=2&qty=1&qty=5", content=b"q", headers=keyed(key))
    swapped = client.post(url + "?a=2&qty=5&qty=1", content=b"q", headers=keyed(key))
    reordered = client.post(url + "?qty=1&a=2&qty=5", content=b"q", headers=keyed(key))
    assert first.status_code == 201
    assert swapped.status_code == 422  # the upstream would read other values: never a replay
    assert problem_type(swapped) == "idempotency-key-reused"
    assert reordered.headers["idempotency-replayed"] == "true"  # names in another order
    assert reordered.content == first.content
    assert len(backend.effects(key=f'"{key}"')) == 1


async def test_20_concurrent_same_key_requests_across_processes_forward_once(
    proxy: Proxy, trusting_proxy: Proxy, backend: Backend
) -> None:
    key = new_key()
    bases = itertools.cycle([proxy.url, trusting_proxy.url])
    limits = httpx.Limits(max_connections=40)
    async with httpx.AsyncClient(timeout=15.0, limits=limits) as c:
        answers = await asyncio.gather(
            *(
                c.post(f"{next(bases)}/orders?delay_ms=300", content=b"once", headers=keyed(key))
                for _ in range(20)
            )
        )
    statuses = [a.status_code for a in answers]
    assert set(statuses) <= {201, 409}, statuses
    originals = [
        a for a in answers if a.status_code == 201 and "idempotency-replayed" not in a.headers
    ]
    assert len(originals) == 1
    assert len(backend.effects(key=f'"{key}"')) == 1
    # Every 201 is the one answer; every 409 says the first is still in flight.
    assert {a.content for a in answers if a.status_code == 201} == {originals[0].content}
    conflicts = [a for a in answers if a.status_code == 409]
    assert all(problem_type(a) == "idempotency-request-in-progress" for a in conflicts)


def test_upstream_5xx_is_released_by_the_status_policy(
    proxy: Proxy, backend: Backend, client: httpx.Client
) -> None:
    key = new_key()
    for _ in range(2):
        answer = client.post(proxy.url + "/orders?status=503", content=b"s", headers=keyed(key))
        assert answer.status_code == 503
        assert "idempotency-replayed" not in answer.headers
    # The upstream answered each time, so each answer settled the key: released, run again.
    assert len(backend.effects(key=f'"{key}"')) == 2


def test_read_timeout_is_504_then_outcome_unknown_and_never_a_second_forward(
    proxy: Proxy, backend: Backend, client: httpx.Client
) -> None:
    key = new_key()
    url = proxy.url + "/orders?delay_ms=2500"  # longer than upstream_timeout = 1.5
    first = client.post(url, content=b"slow", headers=keyed(key))
    assert first.status_code == 504
    assert problem_type(first) == "upstream-timeout"
    retry = client.post(url, content=b"slow", headers=keyed(key))
    assert retry.status_code == 409
    assert problem_type(retry) == "idempotency-outcome-unknown"
    assert len(backend.effects(key=f'"{key}"')) == 1


def _echo(client: httpx.Client, base: str, **headers: str) -> tuple[httpx.Response, dict[str, Any]]:
    answer = client.get(base + "/echo", headers=headers)
    assert answer.status_code == 200
    seen = answer.json()
    names: dict[str, Any] = {}
    for name, value in seen["headers"]:
        names.setdefault(name, []).append(value)
    return answer, names


def test_hop_by_hop_headers_are_stripped_both_ways(proxy: Proxy, client: httpx.Client) -> None:
    answer, seen = _echo(
        client,
        proxy.url,
        Connection="keep-alive, X-Private",
        **{
            "X-Private": "hop secret",
            "Keep-Alive": "timeout=9",
            "TE": "trailers",
            "Proxy-Authorization": "Basic c2VjcmV0",
            "Upgrade": "h2c",
            "X-End-To-End": "passes",
        },
    )
    for hop in ("connection", "x-private", "keep-alive", "te", "proxy-authorization", "upgrade"):
        assert hop not in seen, hop
    assert seen["x-end-to-end"] == ["passes"]
    assert seen["host"] == [proxy.upstream.removeprefix("http://")]
    # The backend's answer names X-Hop-Secret in Connection: it stops at the proxy too.
    for hop in ("x-hop-secret", "keep-alive", "proxy-authenticate"):
        assert hop not in answer.headers, hop
    assert answer.headers["x-end-to-end"] == "kept"


def test_forwarded_headers_are_added_and_untrusted_ones_replaced(
    proxy: Proxy, trusting_proxy: Proxy, client: httpx.Client
) -> None:
    spoofed = {"X-Forwarded-For": "6.6.6.6", "Forwarded": "for=6.6.6.6", "X-Forwarded-Host": "evil"}
    _, seen = _echo(client, proxy.url, **spoofed)
    host = proxy.url.removeprefix("http://")
    assert seen["forwarded"] == [f'for=127.0.0.1;proto=http;host="{host}"']
    assert seen["x-forwarded-for"] == ["127.0.0.1"]
    assert seen["x-forwarded-proto"] == ["http"]
    assert seen["x-forwarded-host"] == [host]
    # --trust-forwarded (from RETRYSAFE_TRUST_FORWARDED): the chain is kept and extended.
    _, seen = _echo(client, trusting_proxy.url, **spoofed)
    host = trusting_proxy.url.removeprefix("http://")
    assert seen["forwarded"] == [f'for=6.6.6.6, for=127.0.0.1;proto=http;host="{host}"']
    assert seen["x-forwarded-for"] == ["6.6.6.6, 127.0.0.1"]
    assert seen["x-forwarded-host"] == ["evil"]


def test_streamed_request_bodies_reach_the_backend_whole(
    proxy: Proxy, backend: Backend, client: httpx.Client
) -> None:
    blob = bytes(range(256)) * 12_288  # 3 MiB, chunked, without a key: streamed, not buffered

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(blob), 65_536):
            yield blob[start : start + 65_536]

    answer = client.post(proxy.url + "/upload", content=chunks())
    assert answer.status_code == 201
    assert answer.json() == {
        "id": answer.json()["id"],
        "bytes": len(blob),
        "sha256": hashlib.sha256(blob).hexdigest(),
    }
    # With a key, a chunked body within max_body_size is read, fingerprinted and replayed.
    key = new_key()
    small = blob[:40_000]
    first = client.post(
        proxy.url + "/upload", content=iter([small[:20_000], small[20_000:]]), headers=keyed(key)
    )
    again = client.post(proxy.url + "/upload", content=iter([small]), headers=keyed(key))
    assert first.status_code == again.status_code == 201
    assert again.headers["idempotency-replayed"] == "true"
    assert first.json()["sha256"] == hashlib.sha256(small).hexdigest()
    assert len(backend.effects(key=f'"{key}"')) == 1


def test_a_large_body_with_content_length_streams_through_whole(
    proxy: Proxy, client: httpx.Client
) -> None:
    blob = bytes(range(256)) * 8192  # 2 MiB with Content-Length: the server delivers it in parts
    answer = client.post(proxy.url + "/upload", content=blob)
    assert answer.status_code == 201
    assert answer.json()["sha256"] == hashlib.sha256(blob).hexdigest()


def test_head_answers_end_at_their_head_and_the_next_request_is_served(
    proxy: Proxy, client: httpx.Client
) -> None:
    for _ in range(3):  # a HEAD answer's Content-Length has no body behind it
        head = client.head(proxy.url + "/health")
        assert head.status_code == 200
        assert head.headers["content-length"] == "11"
        assert head.content == b""
    assert client.post(proxy.url + "/orders", content=b"after-head").status_code == 201


def test_a_response_over_the_stored_limit_streams_whole_and_replays_without_body(
    proxy: Proxy, backend: Backend, client: httpx.Client
) -> None:
    key = new_key()
    url = proxy.url + "/orders?size=300000"  # chunked by the backend; limit: 65536
    with client.stream("POST", url, content=b"big", headers=keyed(key)) as first:
        assert first.status_code == 201
        pieces = list(first.iter_raw())
    body = b"".join(pieces)
    assert len(body) == 300_000
    number = backend.effects(key=f'"{key}"')[0]["id"]
    assert body == ((b"%08d" % number) * 40_000)[:300_000]
    again = client.post(url, content=b"big", headers=keyed(key))
    assert again.status_code == 201
    assert again.headers["idempotency-body-omitted"] == "true"
    assert again.content == b""
    assert again.headers["location"] == f"/orders/{number}"
    assert len(backend.effects(key=f'"{key}"')) == 1


def test_health_and_readiness_are_answered_by_the_proxy_itself(
    proxy: Proxy, client: httpx.Client
) -> None:
    health = client.get(proxy.url + "/-/healthz")
    assert health.status_code == 200
    assert health.json() == {"status": "ok"}  # the backend would have answered 404
    ready = client.get(proxy.url + "/-/readyz")
    assert ready.status_code == 200
    assert json.loads(ready.content) == {"status": "ready", "store": "ok"}


def test_proxy_logs_have_no_traceback(proxy: Proxy, trusting_proxy: Proxy) -> None:
    for server in (proxy, trusting_proxy):
        assert "Traceback" not in server.log_text(), server.log_text()


@pytest.mark.parametrize("flag", [(), ("--access-log",)], ids=["default", "--access-log"])
def test_the_access_log_is_off_unless_asked_for(
    module_processes: Processes,
    backend: Backend,
    store_url: str,
    client: httpx.Client,
    flag: tuple[str, ...],
) -> None:
    """A line per request costs a busy proxy about half of what forwarding costs: off by
    default, even at log level info (start-up and warnings still print)."""
    logged = module_processes.proxy(backend.url, store_url, "--log-level", "info", *flag)
    try:
        marker = f"/orders?probe={new_key()}"
        assert client.post(logged.url + marker, content=b"t").status_code == 201
    finally:
        logged.stop()
    text = logged.log_text()
    assert "Application startup complete" in text
    assert (marker in text) is bool(flag), text
