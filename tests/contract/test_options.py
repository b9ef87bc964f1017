"""Wire-contract options, through both shells on every store: Stripe's replay header, the
retention header, and a 409's Retry-After that follows how long the route takes."""

from __future__ import annotations

import math
import time
from email.utils import parsedate_to_datetime

from .conftest import ServiceFactory
from .harness import REPLAYED, World

ORDER = {"item": "book", "quantity": 1}


def test_replays_carry_every_configured_replay_header(make_service: ServiceFactory) -> None:
    svc = make_service(replay_headers=("Idempotency-Replayed", "Idempotent-Replayed"))
    first = svc.post(key="k", json=ORDER)
    replay = svc.post(key="k", json=ORDER)
    assert "idempotent-replayed" not in first.headers
    assert replay.headers[REPLAYED] == "true"
    assert replay.headers["idempotent-replayed"] == "true"


def test_the_retention_header_says_the_same_expiry_on_the_first_response_and_its_replay(
    make_service: ServiceFactory,
) -> None:
    svc = make_service(retention_header="Idempotency-Key-Expires", ttl=600)
    before = time.time()
    first = svc.post(key="k", json=ORDER)
    replay = svc.post(key="k", json=ORDER)
    expires = parsedate_to_datetime(first.headers["idempotency-key-expires"]).timestamp()
    assert before + 600 - 1 <= expires <= time.time() + 600
    assert replay.headers["idempotency-key-expires"] == first.headers["idempotency-key-expires"]
    assert replay.headers[REPLAYED] == "true"


def test_a_409_says_retry_when_the_route_is_likely_done_not_when_the_lease_ends(
    make_service: ServiceFactory, world: World
) -> None:
    svc = make_service(lease=30)
    # Teach the estimate: the route takes about 0.3 s here (longer on a busy machine: the
    # client's own measure bounds what the server saw).
    began = time.monotonic()
    svc.post("/orders?sleep=0.3", key="warm", json=ORDER)
    took = time.monotonic() - began
    slow = svc.background("/orders?hold=2", key="k", json=ORDER)
    world.wait_entered(2)
    duplicate = svc.post("/orders?hold=2", key="k", json=ORDER)
    world.open(2)
    assert slow.result().status_code == 201
    assert duplicate.status_code == 409
    # Not 30 (the lease): the route's time, in whole seconds, at least 1.
    assert 1 <= int(duplicate.headers["retry-after"]) <= max(1, math.ceil(took)), took
