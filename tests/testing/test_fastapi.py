"""The testing tools on FastAPI, with httpx's ASGI transport (as a FastAPI user tests)."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest

from retrysafe.stores import MemoryStore
from retrysafe.testing import (
    Clock,
    asend_duplicates,
    assert_problem,
    assert_replayed,
    send_duplicates,
)

from .apps import Orders, fastapi_app

ORDER = {"item": "tea", "quantity": 1}


def client(app: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


async def test_a_retry_is_replayed_and_runs_nothing(retrysafe_store: MemoryStore) -> None:
    orders = Orders()
    async with client(fastapi_app(retrysafe_store, orders)) as http:
        first = await http.post("/orders", json=ORDER, headers={"Idempotency-Key": '"k1"'})
        second = await http.post("/orders", json=ORDER, headers={"Idempotency-Key": '"k1"'})
    assert first.status_code == 201
    assert_replayed(first, second)
    assert len(orders.effects) == 1


async def test_a_key_reused_for_another_order_is_a_422(retrysafe_store: MemoryStore) -> None:
    async with client(fastapi_app(retrysafe_store, Orders())) as http:
        await http.post("/orders", json=ORDER, headers={"Idempotency-Key": "k2"})
        other = await http.post(
            "/orders", json={**ORDER, "quantity": 2}, headers={"Idempotency-Key": "k2"}
        )
    problem = assert_problem(other, "idempotency-key-reused")
    assert "different request" in problem["detail"]


async def test_a_missing_key_is_a_400(retrysafe_store: MemoryStore) -> None:
    async with client(fastapi_app(retrysafe_store, Orders())) as http:
        response = await http.post("/orders", json=ORDER)
    assert_problem(response, "idempotency-key-missing")


async def test_concurrent_duplicates_run_the_handler_once(retrysafe_store: MemoryStore) -> None:
    orders = Orders()
    app = fastapi_app(retrysafe_store, orders)
    orders.hold()

    async def release_when_entered() -> None:
        await orders.until_entered()
        await asyncio.sleep(0.05)  # let the other duplicates meet the running one
        orders.release()

    releaser = asyncio.create_task(release_when_entered())
    responses = await asend_duplicates(app, "POST", "/orders", n=8, json=ORDER)
    await releaser
    assert Counter(r.status_code for r in responses) == {201: 1, 409: 7}
    for response in responses:
        if response.status_code == 409:
            assert_problem(response, "idempotency-request-in-progress")
    assert len(orders.effects) == 1


def test_send_duplicates_runs_an_asgi_app_from_a_plain_test(retrysafe_store: MemoryStore) -> None:
    orders = Orders()
    responses = send_duplicates(fastapi_app(retrysafe_store, orders), "POST", "/orders", json=ORDER)
    assert len(responses) == 10
    assert len(orders.effects) == 1
    winner = next(r for r in responses if "idempotency-replayed" not in r.headers)
    for response in responses:
        if response is not winner:
            assert response.status_code == 409 or response.headers["Idempotency-Replayed"]


async def test_retry_after_follows_the_clock(
    retrysafe_store: MemoryStore, retrysafe_clock: Clock
) -> None:
    orders = Orders()
    orders.hold()
    async with client(fastapi_app(retrysafe_store, orders, lease=30)) as http:
        first = asyncio.create_task(
            http.post("/orders", json=ORDER, headers={"Idempotency-Key": "k3"})
        )
        await orders.until_entered()
        again = await http.post("/orders", json=ORDER, headers={"Idempotency-Key": "k3"})
        assert_problem(again, "idempotency-request-in-progress", retry_after=30)
        retrysafe_clock.advance(20)
        later = await http.post("/orders", json=ORDER, headers={"Idempotency-Key": "k3"})
        assert_problem(later, "idempotency-request-in-progress", retry_after=10)
        orders.release()
        assert (await first).status_code == 201


async def test_the_retention_ends_when_the_clock_passes_the_ttl(
    retrysafe_store: MemoryStore, retrysafe_clock: Clock
) -> None:
    orders = Orders()
    async with client(fastapi_app(retrysafe_store, orders, ttl=3600)) as http:
        await http.post("/orders", json=ORDER, headers={"Idempotency-Key": "k4"})
        retrysafe_clock.advance(3599)
        replay = await http.post("/orders", json=ORDER, headers={"Idempotency-Key": "k4"})
        retrysafe_clock.advance(2)
        fresh = await http.post("/orders", json=ORDER, headers={"Idempotency-Key": "k4"})
    assert replay.headers["Idempotency-Replayed"] == "true"
    assert fresh.status_code == 201 and "Idempotency-Replayed" not in fresh.headers
    assert len(orders.effects) == 2


async def test_a_lapsed_lease_lets_the_retry_take_over(
    retrysafe_store: MemoryStore, retrysafe_clock: Clock
) -> None:
    orders = Orders()
    orders.hold()
    async with client(fastapi_app(retrysafe_store, orders, lease=30)) as http:
        stuck = asyncio.create_task(
            http.post("/orders", json=ORDER, headers={"Idempotency-Key": "k5"})
        )
        await orders.until_entered()
        retrysafe_clock.advance(31)  # as if the first request's process had died
        retry = asyncio.create_task(
            http.post("/orders", json=ORDER, headers={"Idempotency-Key": "k5"})
        )
        await asyncio.sleep(0.05)  # the retry takes the key over, then waits at the gate too
        orders.release()
        first, retry = await stuck, await retry
    assert first.status_code == 201
    assert retry.status_code == 201 and "Idempotency-Replayed" not in retry.headers
    assert len(orders.effects) == 2  # a lapsed lease runs the operation again


@pytest.mark.usefixtures("retrysafe_disabled")
async def test_disabled_every_request_runs(retrysafe_store: MemoryStore) -> None:
    orders = Orders()
    async with client(fastapi_app(retrysafe_store, orders)) as http:
        no_key = await http.post("/orders", json=ORDER)
        for _ in range(2):
            await http.post("/orders", json=ORDER, headers={"Idempotency-Key": "k6"})
    assert no_key.status_code == 201
    assert len(orders.effects) == 3
