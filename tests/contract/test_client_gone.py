"""A client that leaves before its body is complete, on every shell and store: nothing runs, no
key is reserved, the shell answers ``400`` with no body (which reaches only a client that closed
just its side), and the retry runs as if the cut request had never come."""

from __future__ import annotations

import time
from typing import Any

import pytest

from .conftest import ServiceFactory
from .harness import REPLAYED, World

ORDER = {"item": "book", "quantity": 2}
#: Shells whose framework drops such a request before the middleware sees it: Django's ASGI
#: handler reads the whole body first and ends the request, unanswered, at the disconnect.
DROPPED_BY_THE_FRAMEWORK = {"django-async"}
#: Shells on a real server that closes the whole connection when the client closes its side:
#: the middleware sees the body end early (and answers), but no answer can reach the client.
CLOSED_BY_THE_SERVER = {"aiohttp"}


def _assert_nothing_ran_and_the_retry_runs(
    make_service: ServiceFactory, world: World, shell: str, cut: Any
) -> None:
    events: list[str] = []
    svc = make_service(on_event=lambda event, details: events.append(event))
    status = cut(svc)
    if shell in DROPPED_BY_THE_FRAMEWORK:
        assert status is None
        assert events == []
    else:
        assert status == (None if shell in CLOSED_BY_THE_SERVER else 400)
        deadline = time.monotonic() + 5  # a real server may report after the client has left
        while not events and time.monotonic() < deadline:
            time.sleep(0.01)
        assert events == ["client_gone"]
    assert world["/orders"] == 0
    retry = svc.post(key="k1", json=ORDER)  # no reservation was left behind: it runs at once
    assert retry.status_code == 201, retry.text
    assert REPLAYED not in retry.headers and retry.json()["call"] == 1
    replay = svc.post(key="k1", json=ORDER)
    assert replay.headers[REPLAYED] == "true" and replay.content == retry.content
    assert world["/orders"] == 1


@pytest.mark.parametrize("sent", [0, 10], ids=["no-body", "part-of-it"])
def test_a_client_that_leaves_before_its_body_is_complete_runs_nothing_and_the_retry_runs(
    make_service: ServiceFactory, world: World, shell: str, sent: int
) -> None:
    _assert_nothing_ran_and_the_retry_runs(
        make_service, world, shell, lambda svc: svc.cut(key="k1", json=ORDER, sent=sent)
    )


@pytest.mark.parametrize("shell", ["wsgi", "flask", "django"])
def test_a_wsgi_stream_that_fails_mid_body_is_the_client_leaving(
    make_service: ServiceFactory, world: World, shell: str
) -> None:
    # uWSGI and mod_wsgi raise OSError from wsgi.input when the connection breaks (gunicorn's
    # stream just ends): the same decision, never a 500.
    _assert_nothing_ran_and_the_retry_runs(
        make_service, world, shell, lambda svc: svc.cut(key="k1", json=ORDER, sent=10, error=True)
    )
