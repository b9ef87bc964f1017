"""The same OrderHub contract (DESIGN section 5) on every framework ``retrysafe demo`` serves:
black-box checks against a real ``retrysafe demo --framework NAME`` process for each name."""

from __future__ import annotations

import concurrent.futures
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from retrysafe.demo.serve import SERVERS

from .servers import DemoServer

pytestmark = pytest.mark.e2e

ORDER = {"item": "espresso machine", "quantity": 1}


@pytest.fixture(params=list(SERVERS))
def hub(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DemoServer]:
    """One OrderHub process of the framework under test, on its own SQLite store."""
    server = DemoServer(
        f"sqlite:///{tmp_path}/store.db",
        log_dir=tmp_path / "logs",
        lease=5.0,
        extra_args=("--framework", request.param),
    )
    server.start(timeout=40)
    yield server
    server.stop()


def _key() -> dict[str, str]:
    return {"Idempotency-Key": f'"{uuid.uuid4()}"'}


def _post(hub: DemoServer, path: str, **kwargs: object) -> httpx.Response:
    return httpx.post(hub.url + path, timeout=30, **kwargs)  # type: ignore[arg-type]


def test_an_order_is_created_once_and_replayed(hub: DemoServer) -> None:
    key = _key()
    first = _post(hub, "/orders", json=ORDER, headers=key)
    replay = _post(hub, "/orders", json=ORDER, headers=key)
    assert first.status_code == 201
    body = first.json()
    assert (body["item"], body["quantity"]) == (ORDER["item"], ORDER["quantity"])
    assert first.headers["location"] == f"/orders/{body['id']}"
    assert replay.status_code == 201
    assert replay.headers["idempotency-replayed"] == "true"
    assert replay.content == first.content
    listing = httpx.get(hub.url + "/orders", timeout=10).json()
    assert listing["count"] == 1
    assert httpx.get(hub.url + f"/orders/{body['id']}", timeout=10).json()["id"] == body["id"]


def test_a_reused_key_is_422_a_missing_payment_key_400_and_nothing_runs(hub: DemoServer) -> None:
    key = _key()
    _post(hub, "/orders", json=ORDER, headers=key)
    reused = _post(hub, "/orders", json={**ORDER, "quantity": 2}, headers=key)
    assert reused.status_code == 422
    assert reused.headers["content-type"].startswith("application/problem+json")
    missing = _post(hub, "/payments", json={"amount": 5, "currency": "EUR"})
    assert missing.status_code == 400
    assert httpx.get(hub.url + "/payments", timeout=10).json()["count"] == 0
    assert httpx.get(hub.url + "/orders", timeout=10).json()["count"] == 1


def test_a_duplicate_of_a_slow_order_is_409_with_retry_after(hub: DemoServer) -> None:
    key = _key()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        slow = pool.submit(_post, hub, "/orders?delay_ms=1500", json=ORDER, headers=key)
        time.sleep(0.5)
        duplicate = _post(hub, "/orders?delay_ms=1500", json=ORDER, headers=key)
        assert slow.result().status_code == 201
    assert duplicate.status_code == 409
    assert int(duplicate.headers["retry-after"]) >= 1


def test_keys_are_scoped_per_user(hub: DemoServer) -> None:
    key = _key()
    alice = _post(hub, "/orders", json=ORDER, headers={**key, "Authorization": "Bearer alice"})
    bob = _post(hub, "/orders", json=ORDER, headers={**key, "Authorization": "Bearer bob"})
    assert alice.status_code == bob.status_code == 201
    assert "idempotency-replayed" not in bob.headers
    assert alice.json()["id"] != bob.json()["id"]


def test_a_failing_handler_releases_the_key_and_bad_bodies_never_give_a_500(
    hub: DemoServer,
) -> None:
    key = _key()
    failed = _post(hub, "/orders?fail=1", json=ORDER, headers=key)
    again = _post(hub, "/orders?fail=1", json=ORDER, headers=key)
    assert failed.status_code >= 500 and again.status_code >= 500
    assert "idempotency-replayed" not in again.headers  # released, not stored
    for content in (b"not json", b"\xff\xfe", b"{"):
        bad = _post(
            hub, "/orders", content=content, headers={**_key(), "Content-Type": "application/json"}
        )
        assert 400 <= bad.status_code < 500
    huge = _post(hub, "/orders", content=b"x" * (1024 * 1024 + 1), headers=_key())
    assert huge.status_code == 413
    assert httpx.get(hub.url + "/orders", timeout=10).json()["count"] == 0


def test_the_page_is_served(hub: DemoServer) -> None:
    page = httpx.get(hub.url + "/", timeout=10)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert b"OrderHub" in page.content
