"""The testing tools on Flask, with Flask's own test client (as a Flask user tests)."""

from __future__ import annotations

import threading

import pytest

from retrysafe.stores import MemoryStore
from retrysafe.testing import (
    Clock,
    assert_problem,
    assert_replayed,
    idempotency_disabled,
    send_duplicates,
)

from .apps import Orders, flask_app

ORDER = {"item": "tea", "quantity": 1}


def test_replay_through_flasks_test_client(retrysafe_store: MemoryStore) -> None:
    orders = Orders()
    http = flask_app(retrysafe_store, orders).test_client()
    first = http.post("/orders", json=ORDER, headers={"Idempotency-Key": "f1"})
    second = http.post("/orders", json=ORDER, headers={"Idempotency-Key": "f1"})
    reused = http.post("/orders", json={"item": "cake"}, headers={"Idempotency-Key": "f1"})
    assert first.status_code == 201
    assert_replayed(first, second)
    assert_problem(reused, "idempotency-key-reused")
    assert len(orders.effects) == 1


def test_duplicates_from_threads_make_one_order(retrysafe_store: MemoryStore) -> None:
    orders = Orders()
    responses = send_duplicates(flask_app(retrysafe_store, orders), "POST", "/orders", json=ORDER)
    assert len(orders.effects) == 1
    created = [r for r in responses if r.status_code == 201]
    assert created, [r.status_code for r in responses]
    for response in responses:
        if response.status_code == 409:
            assert_problem(response, "idempotency-request-in-progress")
        else:
            assert response.json() == created[0].json()


def test_retry_after_follows_the_clock(
    retrysafe_store: MemoryStore, retrysafe_clock: Clock
) -> None:
    orders = Orders()
    app = flask_app(retrysafe_store, orders, lease=30)
    orders.hold()
    first: list[object] = []
    worker = threading.Thread(
        target=lambda: first.append(
            app.test_client().post("/orders", json=ORDER, headers={"Idempotency-Key": "f2"})
        )
    )
    worker.start()
    assert orders.entered.wait(10)
    retrysafe_clock.advance(25)
    again = app.test_client().post("/orders", json=ORDER, headers={"Idempotency-Key": "f2"})
    orders.release()
    worker.join(10)
    assert_problem(again, "idempotency-request-in-progress", retry_after=5)
    assert len(orders.effects) == 1


def test_disabled_block(retrysafe_store: MemoryStore) -> None:
    orders = Orders()
    http = flask_app(retrysafe_store, orders).test_client()
    with idempotency_disabled():
        http.post("/orders", json=ORDER, headers={"Idempotency-Key": "f3"})
        http.post("/orders", json=ORDER, headers={"Idempotency-Key": "f3"})
        missing = http.post("/orders", json=ORDER)
    assert missing.status_code == 201
    assert len(orders.effects) == 3
    after = http.post("/orders", json=ORDER)  # the block is over: the key is required again
    assert_problem(after, "idempotency-key-missing")


@pytest.mark.usefixtures("retrysafe_disabled")
def test_disabled_fixture(retrysafe_store: MemoryStore) -> None:
    orders = Orders()
    responses = send_duplicates(
        flask_app(retrysafe_store, orders), "POST", "/orders", n=4, json=ORDER
    )
    assert [r.status_code for r in responses] == [201] * 4
    assert len(orders.effects) == 4
