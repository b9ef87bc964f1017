"""The runners' hot path: :meth:`Operation.decided` gives the claim's verdict on a first
reservation without the generator, and must agree with :meth:`Operation.claim` wherever it
answers; where reaching the verdict takes an action it answers ``None`` (the runner then drives
``claim(reservation)``). :meth:`Operation.completed` takes a completion that did not answer
``True``."""

from __future__ import annotations

from typing import Any

import pytest

from retrysafe import StoreUnavailableError
from retrysafe._core.codec import StoredResponse, encode_response
from retrysafe._core.http import Answer
from retrysafe._core.operation import DEFER, EMIT, EXECUTE, RESERVE
from retrysafe.stores import Reservation

from .script import claimed, completed, flow_for, in_progress, run, won

STORED = encode_response(
    StoredResponse(201, ((b"content-type", b"text/plain"),), b"made", body_omitted=False)
)
OMITTED = encode_response(StoredResponse(200, ((b"content-length", b"9"),), b"", body_omitted=True))


def test_a_won_key_executes_at_once_and_holds_its_token() -> None:
    flow = flow_for()
    assert flow.decided(won("tok-9")) == EXECUTE
    assert flow.token == "tok-9"
    assert not flow.in_tx


@pytest.mark.parametrize(
    "options",
    [{"events": True}, {"transactional": True}, {"retention_header": "Idempotency-Expires"}],
)
def test_a_won_key_with_steps_before_the_work_is_left_to_the_claim(options: Any) -> None:
    flow = flow_for(**options)
    assert flow.decided(won()) is None
    assert flow.token == ""


@pytest.mark.parametrize("data", [STORED, OMITTED])
def test_a_replay_answers_as_the_claim_does(data: bytes) -> None:
    flow = flow_for()
    fast = flow.decided(completed(flow, data))
    slow = run(flow_for().claim(), [(RESERVE, None, completed(flow, data))]).value
    assert isinstance(fast, Answer)
    assert isinstance(slow, Answer)
    assert (fast.status, fast.headers, fast.body) == (slow.status, slow.headers, slow.body)


@pytest.mark.parametrize(
    "reservation",
    [
        lambda flow: completed(flow, STORED, same=False),  # 422
        lambda flow: completed(flow, b"RS\x02junk"),  # unreadable: 503
        lambda flow: in_progress(flow),  # 409
        lambda flow: in_progress(flow, 0.0, committed=True),  # outcome unknown
    ],
)
def test_every_other_reservation_is_left_to_the_claim(reservation: Any) -> None:
    flow = flow_for()
    assert flow.decided(reservation(flow)) is None


def test_a_replay_is_left_to_the_claim_when_a_hook_listens() -> None:
    flow = flow_for(events=True)
    assert flow.decided(completed(flow, STORED)) is None


def test_the_claim_goes_on_from_a_reservation_already_made() -> None:
    flow = flow_for(events=True)
    result = run(flow.claim(won("tok-3")), [(EMIT, "executed")])
    assert result.value == EXECUTE
    assert flow.token == "tok-3"


def test_the_claim_takes_a_failed_first_reservation_as_its_own() -> None:
    flow = flow_for(events=True)
    error = StoreUnavailableError("down", store="memory")
    answer = run(flow.claim(error), [(EMIT, "store_error")]).value
    assert isinstance(answer, Answer)
    assert answer.status == 503


def test_the_claim_raises_what_is_no_store_failure() -> None:
    with pytest.raises(KeyError):
        run(flow_for().claim(KeyError("bug")), [])


def test_a_fenced_completion_reports_the_lost_lease_once() -> None:
    flow = claimed(events=True)
    run(flow.completed(STORED, False), [(EMIT, "lease_lost")])
    assert flow.lease_lost
    run(flow.completed(STORED, False), [])


def test_a_failed_completion_is_deferred() -> None:
    flow = claimed(events=True)
    error = StoreUnavailableError("down", store="memory")
    run(flow.completed(STORED, error), [(EMIT, "completion_deferred"), (DEFER, STORED)])


def test_reservation_is_not_changed() -> None:
    reservation = won()
    flow_for().decided(reservation)
    assert reservation == Reservation(token="tok-1")
