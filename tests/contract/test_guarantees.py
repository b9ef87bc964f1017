"""Guarantees 2-4 of DESIGN section 3 as a client sees them, on every shell and every store:
leases (takeover after a lapse, renewal of a slow handler), fencing, lost responses, and a
handler's exception freeing its key."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from retrysafe._core.fingerprint import fingerprint
from retrysafe._core.keys import record_id

from .conftest import Backend, ServiceFactory
from .harness import REPLAYED, Service, World, problem_type

ORDER = {"item": "book", "quantity": 2}


# -- leases (guarantee 2) ---------------------------------------------------------------------


def test_the_key_of_a_process_that_stopped_renewing_is_taken_over_after_its_lease(
    backend: Backend, svc: Service, world: World
) -> None:
    # Another process reserved this very request and died: its lease (2 s) is never renewed. Two
    # seconds, not one: the first post must meet the lease live on a machine busy enough (CI,
    # with another suite beside this one) to stall a request for over a second.
    body = json.dumps(ORDER).encode()
    address = record_id("", "POST", "/orders", "k1")
    same_request = fingerprint("POST", "/orders", b"", body, content_type=b"application/json")
    store = backend.sync_store()
    started = time.monotonic()  # before the reservation: its lease ends 2 s after this, or later
    dead = store.reserve(address, same_request, lease=2.0, ttl=60.0)
    assert dead.token is not None
    blocked = svc.post(key="k1", content=body, headers={"Content-Type": "application/json"})
    assert blocked.status_code == 409, blocked.text
    assert problem_type(blocked) == "idempotency-request-in-progress"
    assert blocked.headers["retry-after"] in ("1", "2")  # what is left of the lease
    assert world["/orders"] == 0
    taken = blocked
    while taken.status_code == 409 and time.monotonic() - started < 8.0:
        time.sleep(0.1)
        taken = svc.post(key="k1", content=body, headers={"Content-Type": "application/json"})
    assert taken.status_code == 201
    assert REPLAYED not in taken.headers
    assert time.monotonic() - started >= 2.0  # not before the lease ended
    replay = svc.post(key="k1", content=body, headers={"Content-Type": "application/json"})
    assert replay.headers[REPLAYED] == "true"
    assert replay.content == taken.content
    assert world["/orders"] == 1


def test_lease_renewal_keeps_a_slow_handler_from_running_twice(
    make_service: ServiceFactory, world: World
) -> None:
    # Renewed every second while the handler sleeps 6 s: a renewal may be two seconds late (a
    # busy machine, a renewal waiting behind the probes' row locks on a SQL store) without the
    # lease lapsing, and the handler still outlives two leases.
    svc = make_service(lease=3.0)
    params = {"sleep": "6.0"}
    start = time.monotonic()
    first = svc.background(key="k1", json=ORDER, params=params)
    probes = []
    for _ in range(5):  # two of them after the first lease would have lapsed
        time.sleep(1.0)
        probes.append((time.monotonic() - start, svc.post(key="k1", json=ORDER, params=params)))
    done = first.result()
    replay = svc.post(key="k1", json=ORDER, params=params)
    # Every probe met the live first request (409), except, on a machine slow enough that the
    # probes outlast the handler, a last one answered with the first's stored response.
    for _, probe in probes:
        assert probe.status_code == 409 or (
            probe.headers.get(REPLAYED) == "true" and probe.content == done.content
        ), probe.status_code
    # ... and at least one 409 came after the first lease would have lapsed unrenewed.
    assert any(sent > 3.5 and probe.status_code == 409 for sent, probe in probes), [
        (round(sent, 2), probe.status_code) for sent, probe in probes
    ]
    assert done.status_code == 201
    assert replay.headers[REPLAYED] == "true"
    assert replay.content == done.content
    assert world["/orders"] == 1


# -- fencing (guarantee 3) --------------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["answers", "fails"])
def test_a_request_whose_lease_was_taken_over_can_neither_store_nor_release(
    backend: Backend, make_service: ServiceFactory, world: World, outcome: str
) -> None:
    events: list[str] = []
    old_instance = make_service(on_event=lambda event, details: events.append(event))
    new_instance = make_service()
    params = {"hold": "1,2"} | ({"fail": "first"} if outcome == "fails" else {})
    old = old_instance.background(key="k1", json=ORDER, params=params)
    world.wait_entered(1)
    # The old request stalls for longer than its lease (a pause, a partition): it lapses,
    # and the retry on the other instance takes the key over while the old one still runs.
    backend.lapse_leases()
    new = new_instance.background(key="k1", json=ORDER, params=params)
    world.wait_entered(2)
    world.open(1)
    old_response = old.result()
    # Its own client still gets its answer, but the old request touched no record: the
    # takeover still holds the key (neither the old response stored nor the key released).
    assert old_response.status_code == (201 if outcome == "answers" else 500)
    probe = old_instance.post(key="k1", json=ORDER, params=params)
    assert probe.status_code == 409, probe.text
    world.open(2)
    new_response = new.result()
    assert new_response.status_code == 201 and new_response.json()["call"] == 2
    for instance in (old_instance, new_instance):
        replay = instance.post(key="k1", json=ORDER, params=params)
        assert replay.headers[REPLAYED] == "true"
        assert replay.content == new_response.content
    assert world["/orders"] == 2
    if outcome == "answers":
        assert "lease_lost" in events  # the old instance reports it (metrics, alerts)


# -- lost responses (guarantee 4) ---------------------------------------------------------------


@pytest.mark.parametrize("after", [0, 1], ids=["before-the-head", "mid-body"])
def test_response_is_stored_when_the_client_goes_away_and_the_retry_replays_it(
    svc: Service, world: World, after: int
) -> None:
    svc.abandon(key="k1", json=ORDER, params={"chunks": "3"}, after=after)
    assert world["/orders"] == 1
    retry = svc.post(key="k1", json=ORDER, params={"chunks": "3"})
    assert retry.status_code == 201
    assert retry.headers[REPLAYED] == "true"
    assert retry.json()["call"] == 1
    assert retry.headers["location"] == "/orders/1"
    assert world["/orders"] == 1


@pytest.mark.parametrize("shell", ["wsgi", "flask"])
def test_wsgi_app_iterable_is_closed_once_also_when_the_server_stops_early(
    svc: Service, world: World
) -> None:
    # PEP 3333: the middleware calls close() on the app's iterable, whoever stops reading (on
    # Flask: the view's response iterable, through Werkzeug's response and the test client).
    svc.post(key="k1", json=ORDER, params={"chunks": "3"})
    svc.abandon(key="k2", json=ORDER, params={"chunks": "3"}, after=1)
    svc.abandon(key="k3", json=ORDER, params={"chunks": "3"}, after=0)
    assert world["closed"] == 3


# -- handler exceptions -------------------------------------------------------------------------


def test_handler_exception_releases_the_key_and_the_retry_runs(svc: Service, world: World) -> None:
    failed = svc.post(key="k1", json=ORDER, params={"fail": "first"})
    retried = svc.post(key="k1", json=ORDER, params={"fail": "first"})
    replay = svc.post(key="k1", json=ORDER, params={"fail": "first"})
    assert failed.status_code == 500
    assert REPLAYED not in failed.headers
    assert retried.status_code == 201 and retried.json()["call"] == 2
    assert replay.headers[REPLAYED] == "true" and replay.json()["call"] == 2
    assert world["/orders"] == 2


def test_body_that_fails_midway_releases_the_key_and_the_retry_runs(
    svc: Service, world: World
) -> None:
    params = {"chunks": "3", "fail": "midway"}
    try:
        broken = svc.post(key="k1", json=ORDER, params=params)
    except httpx.HTTPError:
        broken = None  # a server may also just cut the connection
    assert broken is None or REPLAYED not in broken.headers
    retried = svc.post(key="k1", json=ORDER, params=params)
    replay = svc.post(key="k1", json=ORDER, params=params)
    assert retried.status_code == 201 and retried.json()["call"] == 2
    assert replay.headers[REPLAYED] == "true" and replay.content == retried.content
    assert world["/orders"] == 2


def test_a_failure_after_committed_effects_is_never_run_again(svc: Service, world: World) -> None:
    # mark_committed: the effect happened; a failure answer afterwards must not free the key,
    # and a retry, even one sent at once, learns that the outcome is unknown (not "running").
    params = {"mark": "1", "status": "502"}
    for n in range(10):  # several keys: a retry racing the record's last write is caught
        failed = svc.post(key=f"k{n}", json=ORDER, params=params)
        retry = svc.post(key=f"k{n}", json=ORDER, params=params)
        assert failed.status_code == 502
        assert retry.status_code == 409
        assert problem_type(retry) == "idempotency-outcome-unknown", f"key k{n}"
    assert world.marks == [True] * 10
    assert world["/orders"] == 10


def test_committed_success_is_stored_and_replayed(svc: Service, world: World) -> None:
    first = svc.post(key="k1", json=ORDER, params={"mark": "1"})
    replay = svc.post(key="k1", json=ORDER, params={"mark": "1"})
    assert world.marks == [True]
    assert replay.headers[REPLAYED] == "true" and replay.content == first.content
    assert world["/orders"] == 1


def test_mark_committed_without_a_key_is_a_no_op(svc: Service, world: World) -> None:
    first = svc.post(json=ORDER, params={"mark": "1", "status": "502"})
    second = svc.post(json=ORDER, params={"mark": "1", "status": "502"})
    assert (first.status_code, second.status_code) == (502, 502)
    assert world.marks == [True, True]
    assert world["/orders"] == 2


def test_handler_that_always_fails_never_leaves_the_key_in_progress(
    svc: Service, world: World
) -> None:
    answers = [svc.post(key="k1", json=ORDER, params={"fail": "always"}) for _ in range(3)]
    assert [a.status_code for a in answers] == [500] * 3
    assert world["/orders"] == 3
