"""The WSGI shell renews leases from one thread per middleware, which ends once nothing has
been running for a while and starts again with the next keyed request: a test suite that makes
an app per test, or a server that makes one per tenant, is not left with a thread behind each."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from retrysafe._sync import _keeper
from retrysafe.stores import MemoryStore
from retrysafe.wsgi import IdempotencyMiddleware


class CountingStore(MemoryStore):
    """The memory store, counting the renewals it is asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.renewals = 0

    def renew(self, record_id: str, token: str, *, lease: float) -> bool:
        self.renewals += 1
        return super().renew(record_id, token, lease=lease)


def _app(seconds: float) -> Callable[..., Iterable[bytes]]:
    def order(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        environ["wsgi.input"].read()
        time.sleep(seconds)
        start_response("201 Created", [("Content-Type", "application/json")])
        return [b"{}"]

    return order


def _post(app: Callable[..., Iterable[bytes]], key: str) -> str:
    status: list[str] = []
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/orders",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": "2",
        "wsgi.input": io.BytesIO(b"{}"),
        "HTTP_IDEMPOTENCY_KEY": f'"{key}"',
    }
    body = app(environ, lambda s, headers, exc_info=None: status.append(s))
    b"".join(body)
    return status[0]


def _sweepers() -> set[threading.Thread]:
    """The renewing threads alive now (a test worker may hold other tests' too, ending)."""
    return {t for t in threading.enumerate() if t.name == "retrysafe-leases" and t.is_alive()}


def _wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_the_renewing_thread_ends_when_idle_and_comes_back_for_the_next_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_keeper, "IDLE_SECONDS", 0.3)
    before = _sweepers()
    store = CountingStore()
    # A 0.6 s lease is renewed every 0.2 s: a 1 s handler needs renewals to keep it.
    app = IdempotencyMiddleware(_app(1.0), store=store, lease=0.6)
    assert _post(app, "k-1").startswith("201")
    first = store.renewals
    assert first >= 2
    assert _wait_for(lambda: not _sweepers() - before, 5.0), "the idle thread did not end"
    # The next keyed request starts a thread again, and its lease is renewed too.
    assert _post(app, "k-2").startswith("201")
    assert store.renewals - first >= 2
    assert _wait_for(lambda: not _sweepers() - before, 5.0)


def test_apps_made_one_after_another_leave_no_thread_each(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_keeper, "IDLE_SECONDS", 0.2)
    before = _sweepers()
    for n in range(20):
        assert _post(IdempotencyMiddleware(_app(0.0), store=MemoryStore()), f"k-{n}").startswith(
            "201"
        )
    assert _wait_for(lambda: not _sweepers() - before, 5.0), _sweepers() - before
