"""The testing tools on Django, with Django's test clients (sync and async) and its WSGI app."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.wsgi import get_wsgi_application
from django.test import AsyncClient, Client

from retrysafe.stores import MemoryStore
from retrysafe.testing import Clock, assert_problem, assert_replayed, send_duplicates

from .apps import DJANGO_ORDERS

ORDER = {"item": "tea", "quantity": 1}


@pytest.fixture(autouse=True)
def project(settings: Any, retrysafe_store: MemoryStore) -> None:
    """The user's settings, with the test's fresh store."""
    settings.ROOT_URLCONF = "tests.testing.django_urls"
    settings.MIDDLEWARE = [
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "retrysafe.contrib.django.IdempotencyMiddleware",
    ]
    settings.RETRYSAFE = {"STORE": retrysafe_store, "LEASE": 30}
    DJANGO_ORDERS.effects.clear()
    DJANGO_ORDERS.release()


def test_replay_through_djangos_test_client() -> None:
    client = Client()
    first = client.post("/orders", ORDER, content_type="application/json", headers={
        "Idempotency-Key": '"d1"'})  # fmt: skip
    second = client.post("/orders", ORDER, content_type="application/json", headers={
        "Idempotency-Key": '"d1"'})  # fmt: skip
    missing = client.post("/orders", ORDER, content_type="application/json")
    assert first.status_code == 201
    assert_replayed(first, second)
    assert_problem(missing, "idempotency-key-missing")
    assert len(DJANGO_ORDERS.effects) == 1


async def test_replay_through_djangos_async_client() -> None:
    client = AsyncClient()
    headers = {"Idempotency-Key": "d2"}
    first = await client.post("/orders", ORDER, content_type="application/json", headers=headers)
    second = await client.post("/orders", ORDER, content_type="application/json", headers=headers)
    other = await client.post(
        "/orders", {"item": "cake"}, content_type="application/json", headers=headers
    )
    assert_replayed(first, second)
    assert_problem(other, "idempotency-key-reused")


def test_duplicates_at_the_wsgi_app_make_one_order() -> None:
    responses = send_duplicates(get_wsgi_application(), "POST", "/orders", n=6, json=ORDER)
    assert len(DJANGO_ORDERS.effects) == 1
    assert {r.status_code for r in responses} <= {201, 409}


def test_retry_after_follows_the_clock(retrysafe_clock: Clock) -> None:
    import threading

    DJANGO_ORDERS.hold()
    worker = threading.Thread(
        target=Client().post,
        args=("/orders", ORDER),
        kwargs={"content_type": "application/json", "headers": {"Idempotency-Key": "d3"}},
    )
    worker.start()
    try:
        assert DJANGO_ORDERS.entered.wait(10)
        retrysafe_clock.advance(12.5)
        again = Client().post(
            "/orders", ORDER, content_type="application/json", headers={"Idempotency-Key": "d3"}
        )
    finally:
        DJANGO_ORDERS.release()
        worker.join(10)
    assert_problem(again, "idempotency-request-in-progress", retry_after=18)


@pytest.mark.usefixtures("retrysafe_disabled")
def test_disabled_views_run_every_time() -> None:
    client = Client()
    for _ in range(2):
        response = client.post(
            "/orders", ORDER, content_type="application/json", headers={"Idempotency-Key": "d4"}
        )
        assert response.status_code == 201
    assert client.post("/orders", ORDER, content_type="application/json").status_code == 201
    assert len(DJANGO_ORDERS.effects) == 3
