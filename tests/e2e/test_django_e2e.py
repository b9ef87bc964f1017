"""The Django OrderHub as a real multi-process server (gunicorn, several workers): one order for
many concurrent duplicates, for two servers sharing one store, and after a SIGKILL mid-request;
bad input never gets a 500."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from ..conftest import RUN_ID
from ..django.server import DjangoDemo, django_demo, pg_schema_url
from ..stores import backend_mysql

__all__ = ["django_demo"]

pytestmark = pytest.mark.e2e

ORDER = '{"item": "book", "quantity": 2}'
JSON = {"Content-Type": "application/json"}


def _key(value: str) -> dict[str, str]:
    return {**JSON, "Idempotency-Key": f'"{value}"'}


@pytest.fixture(params=["sqlite", "postgres", "mysql", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The ``--store``: SQL ones become the Django ORM store (orders commit with the record);
    Redis keeps the records while the orders go to a SQLite file (mark_committed)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/orderhub.db"
    if request.param == "postgres":
        return pg_schema_url(request)
    if request.param == "mysql":
        return backend_mysql.fresh_database_url(request)
    url = request.getfixturevalue("redis_url")
    return f"{url}?prefix=rs-django-e2e-{RUN_ID}-{tmp_path.name}:"


def _orders(server: DjangoDemo) -> int:
    return int(httpx.get(server.url + "/orders?limit=0", timeout=10).json()["count"])


def test_fifty_concurrent_duplicates_give_one_order(
    django_demo: Callable[..., DjangoDemo], store_url: str
) -> None:
    server = django_demo(store_url)
    with httpx.Client(timeout=30) as client, ThreadPoolExecutor(50) as pool:
        answers = list(
            pool.map(
                lambda _: client.post(
                    server.url + "/orders?delay_ms=200", content=ORDER, headers=_key("same")
                ),
                range(50),
            )
        )
    statuses = {response.status_code for response in answers}
    assert statuses <= {201, 409}, statuses
    created = [r for r in answers if r.status_code == 201]
    assert len({r.content for r in created}) == 1  # every 201 is the one order
    assert sum("idempotency-replayed" not in r.headers for r in created) == 1
    assert _orders(server) == 1


def test_two_servers_sharing_one_store_give_one_order(
    django_demo: Callable[..., DjangoDemo], store_url: str
) -> None:
    servers = [django_demo(store_url, workers=2), django_demo(store_url, workers=2)]
    with httpx.Client(timeout=30) as client, ThreadPoolExecutor(20) as pool:
        answers = list(
            pool.map(
                lambda i: client.post(
                    servers[i % 2].url + "/orders?delay_ms=300", content=ORDER,
                    headers=_key("shared"),
                ),
                range(20),
            )
        )  # fmt: skip
    assert {r.status_code for r in answers} <= {201, 409}
    assert (
        sum(r.status_code == 201 and "idempotency-replayed" not in r.headers for r in answers) == 1
    )
    assert _orders(servers[0]) == _orders(servers[1]) == 1
    replay = httpx.post(
        servers[1].url + "/orders?delay_ms=300", content=ORDER, headers=_key("shared"), timeout=10
    )
    assert replay.status_code == 201 and replay.headers["idempotency-replayed"] == "true"


def test_sigkill_mid_request_then_retry_gives_one_order(
    django_demo: Callable[..., DjangoDemo], store_url: str
) -> None:
    lease = 1.5
    server = django_demo(store_url, lease=lease, workers=2)
    failures: list[Exception] = []
    deadline = time.monotonic() + 10

    def send() -> None:
        while time.monotonic() < deadline:
            try:
                answer = httpx.post(
                    server.url + "/orders?delay_ms=20000",
                    content=ORDER,
                    headers=_key("killed"),
                    timeout=30,
                )
            except httpx.TransportError as exc:
                failures.append(exc)
                return
            # A probe held the key at that moment (422, a different request): send again.
            assert answer.status_code == 422, answer.status_code

    client = threading.Thread(target=send)
    client.start()
    while True:
        # Wait until the key is held: another request under it is then a mismatch (422). Should
        # the probe come first, it fails at once (?fail=1: 500, nothing written, key released).
        probe = httpx.post(server.url + "/orders?fail=1", content=ORDER, headers=_key("killed"))
        if probe.status_code == 422:
            break
        assert probe.status_code == 500, probe.status_code
        assert time.monotonic() < deadline
        time.sleep(0.05)
    server.kill()
    client.join(10)
    assert failures, "the killed request got an answer"
    restarted = django_demo(store_url, lease=lease, workers=2)
    time.sleep(lease)  # the dead worker's lease lapses
    first = httpx.post(restarted.url + "/orders", content=ORDER, headers=_key("killed"))
    again = httpx.post(restarted.url + "/orders", content=ORDER, headers=_key("killed"))
    assert first.status_code == 201 and "idempotency-replayed" not in first.headers
    assert again.headers["idempotency-replayed"] == "true"
    assert _orders(restarted) == 1


BAD_KEYS = [b"", b'""', b"a,b", b'"' + b"x" * 300 + b'"', '"ü"'.encode(), b'"open']


def test_bad_input_never_gets_a_500(django_demo: Callable[..., DjangoDemo], tmp_path: Path) -> None:
    server = django_demo(f"sqlite:///{tmp_path}/orderhub.db", workers=2)
    sent: list[tuple[str, int]] = []
    with httpx.Client(base_url=server.url, timeout=20) as client:
        for raw in BAD_KEYS:
            headers = [(b"Content-Type", b"application/json"), (b"Idempotency-Key", raw)]
            response = client.post("/orders", content=ORDER, headers=headers)
            sent.append((f"key {raw[:20]!r}", response.status_code))
            assert response.status_code == 400, raw
        big = b'{"item": "' + b"x" * (1024 * 1024 - 11) + b'"}'
        assert len(big) == 1024 * 1024 + 1
        # Each on a connection of its own: the server closes one whose body it did not read.
        too_large = httpx.post(server.url + "/orders", content=big, headers=_key("big"))
        assert too_large.status_code == 413
        chunked = httpx.post(server.url + "/orders", content=iter([big]), headers=_key("chunk"))
        assert chunked.status_code == 413  # read (de-chunked) up to the limit, then refused
        # A chunked body is part of the fingerprint like any other (Django alone reads none).
        small = [b'{"item": "a", ', b'"quantity": 1}']
        assert client.post("/orders", content=iter(small), headers=_key("c")).status_code == 201
        other = client.post(
            "/orders", content=iter([*small[:1], b'"quantity": 9}']), headers=_key("c")
        )
        assert other.status_code == 422
        for body in (b"not json", b"{", b"[1, 2]", b"\xff\xfe", b'{"item": 1}', b""):
            response = client.post("/orders", content=body, headers=_key(f"body-{body!r}"))
            sent.append((repr(body), response.status_code))
            assert response.status_code in (400, 422), body
            assert response.headers["content-type"].startswith("application/problem+json")
        payment = client.post("/payments", content='{"amount": 5, "currency": "EUR"}', headers=JSON)
        assert payment.status_code == 400  # /payments requires a key
        page = client.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert json.loads(client.get("/orders").content)["count"] == 1  # the chunked one
    assert all(status < 500 for _, status in sent), sent
