"""The testing tools on a Starlette app behind the pure ASGI middleware."""

from __future__ import annotations

from collections import Counter

import httpx
import pytest

from retrysafe.stores import MemoryStore
from retrysafe.testing import assert_problem, assert_replayed, send_duplicates

from .apps import Orders, starlette_app

ORDER = {"item": "tea", "quantity": 1}


async def test_replay_through_httpx(retrysafe_store: MemoryStore) -> None:
    orders = Orders()
    transport = httpx.ASGITransport(app=starlette_app(retrysafe_store, orders))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        first = await http.post("/orders", json=ORDER, headers={"Idempotency-Key": "s1"})
        second = await http.post("/orders", json=ORDER, headers={"Idempotency-Key": "s1"})
    assert_replayed(first, second)
    assert second.headers["Location"] == "/orders/1"


def client(app: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


async def test_malformed_key_and_replay(retrysafe_store: MemoryStore) -> None:
    orders = Orders()
    async with client(starlette_app(retrysafe_store, orders)) as http:
        first = await http.post("/orders", json=ORDER, headers={"Idempotency-Key": "s2"})
        second = await http.post("/orders", json=ORDER, headers={"Idempotency-Key": "s2"})
        malformed = await http.post("/orders", json=ORDER, headers={"Idempotency-Key": ""})
    assert_replayed(first, second)
    assert_problem(malformed, "idempotency-key-invalid")
    assert len(orders.effects) == 1


def test_duplicates_make_one_order(retrysafe_store: MemoryStore) -> None:
    orders = Orders()
    responses = send_duplicates(
        starlette_app(retrysafe_store, orders), "POST", "/orders", n=6, json=ORDER, key="s3"
    )
    assert len(orders.effects) == 1
    assert set(Counter(r.status_code for r in responses)) <= {201, 409}


async def test_a_body_over_the_limit_is_a_413(retrysafe_store: MemoryStore) -> None:
    orders = Orders()
    app = starlette_app(retrysafe_store, orders, max_body_size=10)
    async with client(app) as http:
        response = await http.post("/orders", json=ORDER, headers={"Idempotency-Key": "s4"})
    assert_problem(response, "idempotency-request-too-large")
    assert orders.effects == []


@pytest.mark.usefixtures("retrysafe_disabled")
async def test_disabled_the_middleware_passes_everything(retrysafe_store: MemoryStore) -> None:
    orders = Orders()
    async with client(starlette_app(retrysafe_store, orders)) as http:
        first = await http.post("/orders", json=ORDER, headers={"Idempotency-Key": "s5"})
        second = await http.post("/orders", json=ORDER, headers={"Idempotency-Key": "s5"})
    assert (first.status_code, second.status_code) == (201, 201)
    assert "Idempotency-Replayed" not in second.headers
    assert len(orders.effects) == 2
