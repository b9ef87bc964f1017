"""The testing tools on a plain WSGI app, with httpx's WSGI transport."""

from __future__ import annotations

import httpx

from retrysafe.stores import MemoryStore
from retrysafe.testing import Clock, assert_problem, assert_replayed, send_duplicates

from .apps import Orders, wsgi_app

ORDER = {"item": "tea", "quantity": 1}


def test_replay_through_httpx(retrysafe_store: MemoryStore) -> None:
    orders = Orders()
    transport = httpx.WSGITransport(app=wsgi_app(retrysafe_store, orders))
    with httpx.Client(transport=transport, base_url="http://test") as http:
        first = http.post("/orders", json=ORDER, headers={"Idempotency-Key": "w1"})
        second = http.post("/orders", json=ORDER, headers={"Idempotency-Key": "w1"})
        missing = http.post("/orders", json=ORDER)
    assert_replayed(first, second)
    assert_problem(missing, "idempotency-key-missing")
    assert len(orders.effects) == 1


def test_duplicates_make_one_order(retrysafe_store: MemoryStore) -> None:
    orders = Orders()
    responses = send_duplicates(wsgi_app(retrysafe_store, orders), "POST", "/orders", json=ORDER)
    assert len(responses) == 10
    assert len(orders.effects) == 1


def test_a_record_expires_with_the_clock(
    retrysafe_store: MemoryStore, retrysafe_clock: Clock
) -> None:
    orders = Orders()
    transport = httpx.WSGITransport(app=wsgi_app(retrysafe_store, orders, ttl=60))
    with httpx.Client(transport=transport, base_url="http://test") as http:
        http.post("/orders", json=ORDER, headers={"Idempotency-Key": "w2"})
        retrysafe_clock.advance(61)
        again = http.post("/orders", json=ORDER, headers={"Idempotency-Key": "w2"})
    assert again.status_code == 201 and "Idempotency-Replayed" not in again.headers
    assert len(orders.effects) == 2
