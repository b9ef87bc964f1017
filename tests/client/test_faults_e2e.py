"""The transports and the adapter against a real OrderHub behind a fault-injecting proxy: lost
responses, resets, held answers and 503s. Every logical operation yields exactly one order."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import requests

from retrysafe.client import (
    AsyncRetryingTransport,
    KeyReusedError,
    RetryInfo,
    RetryingAdapter,
    RetryingTransport,
    RetryPolicy,
    retry_info,
)

from ..conftest import RUN_ID
from ..e2e.servers import DemoServer
from .conftest import orders_by_item
from .faultproxy import FORWARDING_FAULTS, FaultProxy

pytestmark = pytest.mark.e2e

#: Faults for the first attempts of the n-th operation (cycled).
SCHEDULES: list[list[str]] = [
    [],
    ["drop"],
    ["reset"],
    ["delay"],
    ["drop_rst", "reset"],
    ["reset", "drop", "drop"],
    ["503", "drop"],
    ["drop", "reset", "drop_rst"],
    ["truncate"],
    ["reset", "truncate", "delay"],
]
OPERATIONS = len(SCHEDULES)
TIMEOUT = 2.5  # the client's read timeout; "delay" holds answers longer
LIBRARIES = ["httpx", "httpx-async", "requests"]


def fast_policy(seed: int) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=6, deadline=30, backoff_initial=0.05, backoff_max=0.2, rng=random.Random(seed)
    )


@pytest.fixture
def proxy(orderhub: DemoServer) -> Iterator[FaultProxy]:
    server = FaultProxy(orderhub.port, lambda n: SCHEDULES[n % len(SCHEDULES)], hold=TIMEOUT + 1)
    server.start()
    yield server
    server.stop()


def send_all(library: str, url: str, bodies: list[dict[str, Any]], **kwargs: Any) -> list[Any]:
    """POST every body to ``url`` as JSON through the library's retrying client; return the
    responses in order. The async client sends them concurrently. The bytes are encoded here,
    the same for every library (requests and httpx serialize JSON differently)."""
    policy = fast_policy(seed=len(bodies))
    headers = {"Content-Type": "application/json", **kwargs.pop("headers", {})}
    encoded = [json.dumps(body).encode() for body in bodies]
    if library == "httpx":
        with httpx.Client(transport=RetryingTransport(policy=policy), timeout=TIMEOUT) as client:
            return [client.post(url, content=b, headers=headers, **kwargs) for b in encoded]
    if library == "requests":
        with requests.Session() as session:
            session.mount("http://", RetryingAdapter(policy))
            return [
                session.post(url, data=b, headers=headers, timeout=TIMEOUT, **kwargs)
                for b in encoded
            ]

    async def run() -> list[Any]:
        transport = AsyncRetryingTransport(policy=policy)
        async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
            limit = asyncio.Semaphore(4)

            async def one(body: bytes) -> httpx.Response:
                async with limit:
                    return await client.post(url, content=body, headers=headers, **kwargs)

            return await asyncio.gather(*(one(b) for b in encoded))

    return asyncio.run(run())


def status(response: Any) -> int:
    code: int = response.status_code
    return code


def info(response: Any) -> RetryInfo:
    found = retry_info(response)
    assert found is not None
    return found


@pytest.mark.parametrize("library", LIBRARIES)
def test_every_operation_makes_exactly_one_order_through_faults(
    library: str, orderhub: DemoServer, proxy: FaultProxy
) -> None:
    prefix = f"{RUN_ID}-faults-{library}-"
    bodies = [{"item": f"{prefix}{i}", "quantity": i + 1} for i in range(OPERATIONS)]
    responses = send_all(library, proxy.url + "/orders", bodies)

    assert [status(r) for r in responses] == [201] * OPERATIONS
    for body, response in zip(bodies, responses, strict=True):
        got = info(response)
        assert got.key is not None
        schedule = proxy.schedule[f'"{got.key}"']
        # The server ran it once: once for a clean pass, once more only as a replay.
        processed_before = any(f in FORWARDING_FAULTS for f in schedule)
        assert got.replayed is processed_before, (body, schedule)
        assert got.attempts == len(schedule) + 1, (body, schedule)
        assert proxy.seen[f'"{got.key}"'] == len(schedule) + 1
        assert response.json()["item"] == body["item"]
    assert orders_by_item(orderhub, prefix) == {b["item"]: 1 for b in bodies}
    injected = sum(proxy.faults.values())
    assert injected == sum(len(s) for s in SCHEDULES)
    print(
        f"{library}: {OPERATIONS} operations, {injected} faults {dict(proxy.faults)}, "
        f"{sum(orders_by_item(orderhub, prefix).values())} orders"
    )


@pytest.mark.parametrize("library", LIBRARIES)
def test_422_is_not_retried(library: str, orderhub: DemoServer, orderhub_proxy: FaultProxy) -> None:
    prefix = f"{RUN_ID}-422-{library}-"
    # The first attempt is reset (retried); the 422 that follows is final.
    (response,) = send_all(library, orderhub_proxy.url + "/orders", [{"item": prefix + "x"}])
    assert status(response) == 422
    got = info(response)
    assert got.attempts == 2
    assert orderhub_proxy.seen[f'"{got.key}"'] == 2
    assert orders_by_item(orderhub, prefix) == {}


@pytest.fixture
def orderhub_proxy(orderhub: DemoServer) -> Iterator[FaultProxy]:
    server = FaultProxy(orderhub.port, lambda n: ["reset"])
    server.start()
    yield server
    server.stop()


@pytest.mark.parametrize("library", LIBRARIES)
def test_key_reused_for_another_body_raises(library: str, orderhub: DemoServer) -> None:
    prefix = f"{RUN_ID}-reuse-{library}-"
    key = {"Idempotency-Key": f'"{prefix}k"'}
    (first,) = send_all(
        library, orderhub.url + "/orders", [{"item": prefix + "a", "quantity": 1}], headers=key
    )
    assert status(first) == 201
    with pytest.raises(KeyReusedError) as caught:
        send_all(
            library, orderhub.url + "/orders", [{"item": prefix + "b", "quantity": 1}], headers=key
        )
    assert caught.value.key == f"{prefix}k"
    assert orders_by_item(orderhub, prefix) == {prefix + "a": 1}


@pytest.mark.parametrize("library", LIBRARIES)
def test_409_in_progress_is_waited_out_and_replayed(library: str, orderhub: DemoServer) -> None:
    prefix = f"{RUN_ID}-409-{library}-"
    body = {"item": prefix + "slow", "quantity": 1}
    headers = {"Idempotency-Key": f'"{prefix}key"'}
    url = orderhub.url + "/orders?delay_ms=1500"
    first: list[httpx.Response] = []
    runner = threading.Thread(
        target=lambda: first.append(
            httpx.post(url, content=json.dumps(body).encode(), headers=headers, timeout=10)
        )
    )
    runner.start()
    try:
        # Wait until the first request holds the key. The probe's body differs, so it gets
        # 422 key-reused once the key is held; should it come first, it is invalid (no
        # quantity), so it makes no order and frees the key again.
        time.sleep(0.2)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            probe = httpx.post(url, json={"item": "probe"}, headers=headers, timeout=10)
            if probe.status_code == 422 and "key-reused" in probe.text:
                break
            time.sleep(0.05)
        assert "key-reused" in probe.text, probe.text
        (response,) = send_all(library, url, [body], headers=headers)
    finally:
        runner.join(timeout=10)
    assert status(response) == 201
    got = info(response)
    assert got.attempts >= 2
    assert got.replayed
    assert first[0].status_code == 201
    assert response.json() == first[0].json()
    assert orders_by_item(orderhub, prefix) == {prefix + "slow": 1}
