"""The wire contract (DESIGN section 2) through the Django middleware, on every store, with the
sync test client (``django``: the sync runner) and the async one (``django-async``: the async
runner under Django's async handler)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections

from . import views
from .conftest import Api, problem_type

Make = Callable[..., Api]


def test_each_client_drives_its_own_runner(make_api: Make) -> None:
    # django: the sync runner under the WSGI-like handler; django-async: the async runner under
    # the async handler, with no thread hop (the middleware runs in async mode).
    api = make_api()
    expected = b"Exchange" if api.kind == "django" else b"AsyncExchange"
    assert api.post("/mode", key="k").body == expected


def test_first_request_runs_and_the_retry_replays_it_byte_for_byte(make_api: Make) -> None:
    api = make_api()
    first = api.post("/orders", '{"item": 1}', key="k1")
    assert first.status_code == 201
    assert "Idempotency-Replayed" not in first
    again = api.post("/orders", '{"item": 1}', key="k1")
    assert again.status_code == 201
    assert again.body == first.body
    assert again["Location"] == first["Location"] == "/orders/1"
    assert again["Content-Type"] == "application/json"
    assert again["Idempotency-Replayed"] == "true"
    assert "session-like" not in again.cookies  # Set-Cookie is never stored
    assert views.CALLS["orders"] == 1


def test_quoted_and_bare_keys_address_one_record(make_api: Make) -> None:
    api = make_api()
    api.post("/orders", key="same")
    bare = api.post("/orders", headers={"Idempotency-Key": "same"})
    assert bare["Idempotency-Replayed"] == "true"
    assert views.CALLS["orders"] == 1


def test_different_keys_each_run(make_api: Make) -> None:
    api = make_api()
    assert api.post("/orders", key="a").status_code == 201
    assert api.post("/orders", key="b").status_code == 201
    assert views.CALLS["orders"] == 2


def test_same_key_with_another_body_is_422_and_nothing_runs(make_api: Make) -> None:
    api = make_api()
    api.post("/orders", '{"item": 1}', key="k")
    other = api.post("/orders", '{"item": 2}', key="k")
    assert other.status_code == 422
    assert problem_type(other) == "idempotency-key-reused"
    assert views.CALLS["orders"] == 1


def test_same_key_on_another_path_is_another_record(make_api: Make) -> None:
    api = make_api()
    api.post("/orders", key="k")
    assert api.post("/orders/7", key="k").status_code == 201
    assert views.CALLS["orders"] == 2


@pytest.mark.parametrize("raw", ["a,b", '"unterminated', "x" * 256, '""'])
def test_malformed_key_is_400_and_nothing_runs(make_api: Make, raw: str) -> None:
    response = make_api().post("/orders", headers={"Idempotency-Key": raw})
    assert response.status_code == 400
    assert problem_type(response) == "idempotency-key-invalid"
    assert views.CALLS["orders"] == 0


def test_missing_key_on_a_required_view_is_400(make_api: Make) -> None:
    api = make_api()
    response = api.post("/required")
    assert response.status_code == 400
    assert problem_type(response) == "idempotency-key-missing"
    assert views.CALLS["required"] == 0
    assert api.post("/required", key="k").status_code == 201


def test_required_app_wide_from_settings(make_api: Make) -> None:
    response = make_api(REQUIRED=True).post("/orders")
    assert response.status_code == 400
    assert views.CALLS["orders"] == 0


def test_optional_key_missing_runs_unprotected_every_time(make_api: Make) -> None:
    api = make_api()
    api.post("/orders")
    api.post("/orders")
    assert views.CALLS["orders"] == 2


def test_body_over_the_limit_is_413_and_nothing_runs(make_api: Make) -> None:
    response = make_api(MAX_BODY_SIZE=10).post("/orders", b"x" * 11, key="k")
    assert response.status_code == 413
    assert problem_type(response) == "idempotency-request-too-large"
    assert views.CALLS["orders"] == 0


def test_view_exception_releases_the_key_and_the_retry_runs(make_api: Make) -> None:
    api = make_api()
    assert api.post("/orders?fail=1", key="k").status_code == 500
    assert api.post("/orders?fail=1", key="k").status_code == 500
    assert views.CALLS["orders"] == 2


@pytest.mark.parametrize("status", [500, 503, 409, 429])
def test_5xx_and_request_rejections_release_the_key(make_api: Make, status: int) -> None:
    api = make_api()
    api.post(f"/orders?status={status}", key="k")
    again = api.post(f"/orders?status={status}", key="k")
    assert again.status_code == status
    assert "Idempotency-Replayed" not in again
    assert views.CALLS["orders"] == 2


@pytest.mark.parametrize("status", [200, 202, 404])
def test_2xx_and_other_4xx_are_stored(make_api: Make, status: int) -> None:
    api = make_api()
    api.post(f"/orders?status={status}", key="k")
    again = api.post(f"/orders?status={status}", key="k")
    assert again.status_code == status
    assert again["Idempotency-Replayed"] == "true"
    assert views.CALLS["orders"] == 1


def test_409_with_retry_after_while_the_first_request_runs(make_api: Make) -> None:
    entered, release = views.gate("g")
    first_api, second_api = make_api(), make_api()
    # Async: an async view waits at the gate (a sync one would hold the one thread where Django
    # runs the sync middleware of every request).
    path = "/orders?gate=g" if first_api.kind == "django" else "/aorders?gate=g"
    name = path[1:].split("?")[0]
    results: dict[str, Any] = {}

    def first() -> None:
        try:
            results["first"] = first_api.post(path, key="k")
        finally:
            connections.close_all()  # this thread's own connections (ORM stores)

    worker = threading.Thread(target=first)
    worker.start()
    try:
        assert entered.wait(10)
        duplicate = second_api.post(path, key="k")
    finally:
        release.set()
        worker.join(15)
    assert duplicate.status_code == 409
    assert problem_type(duplicate) == "idempotency-request-in-progress"
    assert int(duplicate["Retry-After"]) >= 1
    assert results["first"].status_code == 201
    assert views.CALLS[name] == 1
    assert second_api.post(path, key="k")["Idempotency-Replayed"] == "true"


def test_keys_are_scoped_by_the_authorization_header(make_api: Make) -> None:
    api = make_api()
    alice = api.post("/orders", key="k", headers={"Authorization": "Bearer alice"})
    bob = api.post("/orders", key="k", headers={"Authorization": "Bearer bob"})
    assert "Idempotency-Replayed" not in bob
    assert json.loads(alice.body)["n"] == 1 and json.loads(bob.body)["n"] == 2


def test_get_and_opted_out_views_pass_straight_through(make_api: Make) -> None:
    api = make_api()
    api.send("GET", "/orders", key="k")
    api.send("GET", "/orders", key="k")
    api.post("/optout", key="k")
    api.post("/optout", key="k")
    assert views.CALLS["orders"] == 2
    assert views.CALLS["optout"] == 2


def test_streaming_response_is_stored_whole_and_replayed(make_api: Make) -> None:
    api = make_api()
    first = api.post("/streaming", key="k")
    again = api.post("/streaming", key="k")
    assert first.body == b"part0-1;part1-1;part2-1;"
    assert again.body == first.body
    assert again["Idempotency-Replayed"] == "true"
    assert views.CALLS["streaming"] == 1


def test_async_view_is_protected(make_api: Make) -> None:
    api = make_api()
    first = api.post("/aorders", '{"a": 1}', key="k")
    again = api.post("/aorders", '{"a": 1}', key="k")
    assert first.status_code == again.status_code == 201
    assert again.body == first.body
    assert views.CALLS["aorders"] == 1
