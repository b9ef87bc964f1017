"""OrderHub as real processes on loopback, with the SQLite default store (issue 2)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from .servers import DemoServer

pytestmark = pytest.mark.e2e

ORDER = b'{"item": "espresso machine", "quantity": 1}'


async def _post_many(urls: list[str], key: str, count: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        return await asyncio.gather(
            *(
                client.post(
                    urls[i % len(urls)] + "/orders",
                    content=ORDER,
                    headers={"Idempotency-Key": key, "Content-Type": "application/json"},
                )
                for i in range(count)
            )
        )


def _orders(server: DemoServer) -> dict[str, object]:
    data: dict[str, object] = httpx.get(server.url + "/orders", timeout=10).json()
    return data


def _assert_one_logical_order(responses: list[httpx.Response]) -> None:
    created = [r for r in responses if r.status_code == 201]
    assert created, [r.status_code for r in responses]
    assert {r.status_code for r in responses} <= {201, 409}
    firsts = [r for r in created if r.headers.get("idempotency-replayed") != "true"]
    assert len(firsts) == 1
    # Every replay is the first answer, byte for byte, Location included.
    for replay in created:
        assert replay.content == firsts[0].content
        assert replay.headers["location"] == firsts[0].headers["location"]
    for conflict in (r for r in responses if r.status_code == 409):
        assert conflict.headers["content-type"] == "application/problem+json"
        assert int(conflict.headers["retry-after"]) >= 1


def test_50_concurrent_posts_with_one_key_make_one_order(
    demo_servers: Callable[..., DemoServer], tmp_path: Path
) -> None:
    server = demo_servers(f"sqlite:///{tmp_path}/store.db")
    responses = asyncio.run(_post_many([server.url], '"one-key-50"', 50))
    _assert_one_logical_order(responses)
    assert _orders(server)["count"] == 1


def test_two_processes_sharing_one_sqlite_file_make_one_order(
    demo_servers: Callable[..., DemoServer], tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path}/shared.db"
    first, second = demo_servers(store), demo_servers(store)
    responses = asyncio.run(_post_many([first.url, second.url], "shared-key-20", 20))
    _assert_one_logical_order(responses)
    assert _orders(first)["count"] == 1
    assert _orders(second)["count"] == 1


def _send_and_hang_up(port: int, path: str, key: str, after: float) -> None:
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(ORDER)}\r\n\r\n"
    ).encode() + ORDER
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(request)
        time.sleep(after)


def _retry_until_final(url: str, key: str, deadline: float = 20.0) -> httpx.Response:
    stop = time.monotonic() + deadline
    with httpx.Client(timeout=10) as client:
        while True:
            response = client.post(url, content=ORDER, headers={"Idempotency-Key": key})
            if response.status_code != 409 or time.monotonic() > stop:
                return response
            time.sleep(0.1)


def test_client_that_drops_the_connection_gets_the_replay_on_retry(
    demo_servers: Callable[..., DemoServer], tmp_path: Path
) -> None:
    server = demo_servers(f"sqlite:///{tmp_path}/store.db")
    _send_and_hang_up(server.port, "/orders?delay_ms=800", "dropped-1", after=0.2)
    response = _retry_until_final(server.url + "/orders?delay_ms=800", "dropped-1")
    assert response.status_code == 201
    # The response the client never read was stored: the retry is its replay.
    assert response.headers["idempotency-replayed"] == "true"
    assert response.headers["location"] == f"/orders/{response.json()['id']}"
    assert _orders(server)["count"] == 1


def test_killed_process_frees_the_key_at_once_without_a_second_order(
    demo_servers: Callable[..., DemoServer], tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path}/store.db"
    victim = demo_servers(store, lease=30.0)
    survivor = demo_servers(store, lease=30.0)
    url = "/orders?delay_ms=3000"  # the retry must be the same request, query included
    with httpx.Client(timeout=0.5) as client, pytest.raises(httpx.ReadTimeout):
        client.post(victim.url + url, content=ORDER, headers={"Idempotency-Key": "crash-1"})
    # While the victim lives, the key is its own.
    early = httpx.post(survivor.url + url, content=ORDER, headers={"Idempotency-Key": "crash-1"})
    assert early.status_code == 409
    victim.kill()
    killed_at = time.monotonic()
    # Its owner is dead: taken over at once (owner liveness), not after the 30 s lease.
    final = _retry_until_final(survivor.url + url, "crash-1")
    assert final.status_code == 201
    assert final.headers.get("idempotency-replayed") is None
    assert time.monotonic() - killed_at < 10
    assert _orders(survivor)["count"] == 1
    replay = httpx.post(survivor.url + url, content=ORDER, headers={"Idempotency-Key": "crash-1"})
    assert replay.headers["idempotency-replayed"] == "true"
    assert replay.content == final.content


@pytest.mark.parametrize(
    ("headers", "body", "status", "problem"),
    [
        pytest.param(
            {"Idempotency-Key": ""}, ORDER, 400, "idempotency-key-invalid", id="empty-key"
        ),
        pytest.param(
            {"Idempotency-Key": "x" * 256}, ORDER, 400, "idempotency-key-invalid", id="long-key"
        ),
        pytest.param(
            {"Idempotency-Key": '"unterminated'},
            ORDER,
            400,
            "idempotency-key-invalid",
            id="unterminated-sf-string",
        ),
        pytest.param(
            {"Idempotency-Key": "big-1"},
            b'{"item": "' + b"x" * (2 * 1024 * 1024) + b'", "quantity": 1}',
            413,
            "idempotency-request-too-large",
            id="2MiB-body",
        ),
        pytest.param(
            {"Idempotency-Key": "notjson-1"}, b"\x00\xff not json", 400, None, id="binary-body"
        ),
        pytest.param(
            {"Idempotency-Key": "badjson-1", "Content-Type": "application/json"},
            b'{"item": ',
            400,
            None,
            id="invalid-json",
        ),
        pytest.param(
            {"Idempotency-Key": "deep-1"}, b"[" * 200_000, 400, None, id="deeply-nested-json"
        ),
        pytest.param(
            {"Idempotency-Key": "wrongtype-1"},
            b'{"item": 3, "quantity": "three"}',
            422,
            None,
            id="wrong-types",
        ),
    ],
)
def test_bad_input_gets_a_clear_problem_and_creates_nothing(
    demo_servers: Callable[..., DemoServer],
    tmp_path: Path,
    headers: dict[str, str],
    body: bytes,
    status: int,
    problem: str | None,
) -> None:
    server = demo_servers(f"sqlite:///{tmp_path}/store.db")
    for _ in range(2):  # and a retry of the same bad request is just as clean
        response = httpx.post(server.url + "/orders", content=body, headers=headers, timeout=30)
        assert response.status_code == status
        assert response.headers["content-type"] == "application/problem+json"
        payload = response.json()
        assert payload["status"] == status and payload["title"]
        if problem:
            assert payload["type"].endswith(problem)
    assert _orders(server)["count"] == 0
    assert "Traceback" not in server.log_text()


def test_1_mib_json_order_runs_once_and_its_too_large_answer_replays_without_body(
    demo_servers: Callable[..., DemoServer], tmp_path: Path
) -> None:
    server = demo_servers(f"sqlite:///{tmp_path}/store.db")
    filler = b"x" * (1024 * 1024 - 40)
    body = b'{"item": "' + filler + b'", "quantity": 2}'
    assert len(body) <= 1024 * 1024
    first = httpx.post(server.url + "/orders", content=body, headers={"Idempotency-Key": "mib"})
    again = httpx.post(server.url + "/orders", content=body, headers={"Idempotency-Key": "mib"})
    assert first.status_code == 201 and again.status_code == 201
    # The answer echoes the 1 MiB item, over the 1 MiB storable limit: the replay keeps the
    # status and Location, says the body was not kept, and nothing runs twice.
    assert len(first.content) > 1024 * 1024
    assert again.headers["idempotency-replayed"] == "true"
    assert again.headers["idempotency-body-omitted"] == "true"
    assert again.headers["location"] == first.headers["location"]
    assert again.content == b""
    assert _orders(server)["count"] == 1


def test_unknown_store_scheme_is_a_clear_start_up_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "retrysafe", "demo", "--store", "mongodb://localhost/x"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "unknown store URL scheme" in result.stderr
    assert "sqlite://" in result.stderr
    assert "Traceback" not in result.stderr
