"""Per-view settings: ``@idempotent`` on function views, class-based views (on the class or on
one method) and Django REST framework APIView and ViewSet actions; store outages."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from . import views
from .conftest import Api, event_loop, problem_type


@pytest.fixture
def api(settings: Any, client_kind: str) -> Api:
    settings.RETRYSAFE = {"STORE": "memory://"}
    return Api(client_kind)


def test_class_marked_view_requires_a_key(api: Api) -> None:
    assert problem_type(api.post("/cbv")) == "idempotency-key-missing"
    assert views.CALLS["cbv"] == 0
    api.post("/cbv", key="k")
    assert api.post("/cbv", key="k")["Idempotency-Replayed"] == "true"
    assert views.CALLS["cbv"] == 1


def test_method_marked_view_requires_a_key_on_that_method_only(api: Api) -> None:
    assert api.post("/cbv-method").status_code == 400
    assert api.send("PATCH", "/cbv-method").status_code == 201
    assert views.CALLS["cbv-method"] == 1


def test_drf_apiview_method_is_marked(api: Api) -> None:
    assert problem_type(api.post("/drf/api", '{"a": 1}')) == "idempotency-key-missing"
    first = api.post("/drf/api", '{"a": 1}', key="k")
    again = api.post("/drf/api", '{"a": 1}', key="k")
    assert first.status_code == 201
    assert again.body == first.body and b'"data":{"a":1}' in first.body
    assert again["Idempotency-Replayed"] == "true"
    assert views.CALLS["drf"] == 1


def test_drf_viewset_actions_are_marked_one_by_one(api: Api) -> None:
    assert api.post("/drf/set").status_code == 400  # create: required
    assert api.post("/drf/set", key="k").status_code == 201
    assert api.post("/drf/set", key="k")["Idempotency-Replayed"] == "true"
    assert views.CALLS["drf-create"] == 1
    # The extra action opted out: the same key runs it every time.
    api.post("/drf/set/ping", key="k")
    api.post("/drf/set/ping", key="k")
    assert views.CALLS["drf-ping"] == 2


def test_drf_api_view_function_is_marked(api: Api) -> None:
    assert api.post("/drf/function").status_code == 400
    assert api.post("/drf/function", key="k").status_code == 201
    assert api.post("/drf/function", key="k")["Idempotency-Replayed"] == "true"
    assert views.CALLS["drf-function"] == 1


def test_per_view_settings_do_not_leak_to_unmarked_views(api: Api) -> None:
    assert api.post("/required").status_code == 400
    assert api.post("/orders").status_code == 201


def test_unreachable_store_is_503_with_retry_after_and_nothing_runs(
    settings: Any, client_kind: str
) -> None:
    # A closed loopback port: the store answers "connection refused" at once.
    settings.RETRYSAFE = {"STORE": "redis://127.0.0.1:1/0?timeout=1", "STORE_RETRY_AFTER": 7}
    api = Api(client_kind)
    response = api.post("/orders", key="k")
    assert response.status_code == 503
    assert problem_type(response) == "idempotency-store-unavailable"
    assert response["Retry-After"] == "7"
    assert views.CALLS["orders"] == 0


def test_unreachable_store_with_fail_open_runs_the_view_with_its_body(
    settings: Any, client_kind: str
) -> None:
    settings.RETRYSAFE = {"STORE": "redis://127.0.0.1:1/0?timeout=1", "ON_STORE_ERROR": "fail_open"}
    response = Api(client_kind).post("/orders", '{"x": 1}', key="k")
    assert response.status_code == 201
    assert b'"body": "{\\"x\\": 1}"' in response.body
    assert views.CALLS["orders"] == 1


@pytest.mark.django_db(transaction=True)
def test_keys_are_scoped_by_request_user(settings: Any, client_kind: str) -> None:
    from django.contrib.auth.models import User

    settings.RETRYSAFE = {"STORE": "memory://"}
    alice = User.objects.create_user("alice", password="pw")
    bob = User.objects.create_user("bob", password="pw")
    as_alice, as_bob = Api(client_kind), Api(client_kind)
    as_alice.client.force_login(alice)
    as_bob.client.force_login(bob)
    first = as_alice.post("/orders", key="k")
    # Same user, another credential header: still alice's key (the user decides, not the header).
    again = as_alice.post("/orders", key="k", headers={"Authorization": "Bearer other"})
    other = as_bob.post("/orders", key="k")
    assert b'"user": "alice"' in first.body
    assert again["Idempotency-Replayed"] == "true"
    assert "Idempotency-Replayed" not in other and b'"user": "bob"' in other.body
    assert views.CALLS["orders"] == 2


@pytest.mark.parametrize("parsed_first", [False, True], ids=["raw", "parsed-before"])
def test_multipart_uploads_are_fingerprinted_even_when_parsed_before(
    settings: Any, client_kind: str, parsed_first: bool
) -> None:
    settings.RETRYSAFE = {"STORE": "memory://"}
    api = Api(client_kind)
    headers = {"Idempotency-Key": '"up"', **({"X-Read-Post": "1"} if parsed_first else {})}

    def send(content: bytes) -> Any:
        form = {"title": "t", "doc": SimpleUploadedFile("a.txt", content)}
        call = api.client.post
        if api.kind == "django":
            response = call("/upload", form, headers=headers)
        else:
            future = asyncio.run_coroutine_threadsafe(
                call("/upload", form, headers=headers), event_loop()
            )
            response = future.result(30)
        return response

    first = send(b"hello")
    assert first.status_code == 201 and b'"doc": "hello"' in first.content  # the view read it
    assert send(b"hello")["Idempotency-Replayed"] == "true"
    other = send(b"other")
    assert other.status_code == 422  # another file under the same key
    assert views.CALLS["upload"] == 1
