"""The claim: reserve the key, then execute, replay, 409, 422, outcome unknown, wait, 503 or
fail open. Every store answer is scripted; nothing runs a store or a loop."""

from __future__ import annotations

import json

import pytest

from retrysafe import StoreError, StoreUnavailableError
from retrysafe._core.codec import StoredResponse, encode_response
from retrysafe._core.http import Answer
from retrysafe._core.operation import BEGIN, CLOCK, EMIT, EXECUTE, RESERVE, RUN_UNPROTECTED, SLEEP
from retrysafe.stores import Reservation

from .script import completed, flow_for, in_progress, run, won

STORED = encode_response(
    StoredResponse(
        201,
        ((b"content-type", b"application/json"), (b"location", b"/orders/7")),
        b'{"id":7}',
    )
)


def _slug(answer: object) -> str:
    assert isinstance(answer, Answer)
    return str(json.loads(answer.body)["type"]).rsplit(":", 1)[-1]


def _header(answer: Answer, name: bytes) -> bytes | None:
    values = [value for key, value in answer.headers if key == name]
    assert len(values) <= 1
    return values[0] if values else None


# -- the key is won ------------------------------------------------------------------------------


def test_a_won_key_executes_and_holds_its_token() -> None:
    flow = flow_for()
    result = run(flow.claim(), [(RESERVE, None, won("tok-9"))])
    assert result.value == EXECUTE
    assert flow.token == "tok-9"
    assert not flow.in_tx


def test_a_won_key_reports_executed_when_a_hook_is_set() -> None:
    flow = flow_for(events=True)
    result = run(flow.claim(), [(RESERVE, None, won()), (EMIT, "executed")])
    assert result.value == EXECUTE


def test_a_won_key_in_transactional_mode_opens_the_transaction() -> None:
    flow = flow_for(transactional=True)
    assert flow.holds_response
    result = run(flow.claim(), [(RESERVE, None, won()), (BEGIN, None)])
    assert result.value == EXECUTE
    assert flow.in_tx


def test_the_plain_mode_does_not_hold_the_response_back() -> None:
    assert not flow_for().holds_response


# -- replay --------------------------------------------------------------------------------------


@pytest.mark.parametrize("events", [False, True], ids=["no-hook", "hook"])
def test_a_completed_record_of_the_same_request_is_replayed_with_its_headers(
    events: bool,
) -> None:
    flow = flow_for(events=events)
    script: list[tuple[object, ...]] = [(RESERVE, None, completed(flow, STORED))]
    if events:
        script.append((EMIT, "replayed"))
    answer = run(flow.claim(), script).value
    assert isinstance(answer, Answer)
    assert answer.status == 201
    assert answer.body == b'{"id":7}'
    assert answer.headers == [
        (b"content-type", b"application/json"),
        (b"location", b"/orders/7"),
        (b"idempotency-replayed", b"true"),
    ]
    assert flow.token == ""


def test_a_replay_of_an_omitted_body_says_so_with_an_empty_body() -> None:
    flow = flow_for()
    stored = encode_response(
        StoredResponse(
            200,
            ((b"content-length", b"5000000"), (b"etag", b'"v1"')),
            b"",
            body_omitted=True,
        )
    )
    answer = run(flow.claim(), [(RESERVE, None, completed(flow, stored))]).value
    assert isinstance(answer, Answer)
    assert answer.status == 200
    assert answer.body == b""
    assert answer.headers == [
        (b"etag", b'"v1"'),
        (b"content-length", b"0"),
        (b"idempotency-body-omitted", b"true"),
        (b"idempotency-replayed", b"true"),
    ]


@pytest.mark.parametrize("events", [False, True], ids=["no-hook", "hook"])
def test_an_unreadable_stored_response_is_503_not_a_crash(events: bool) -> None:
    flow = flow_for(events=events, store_retry_after=4)
    script: list[tuple[object, ...]] = [(RESERVE, None, completed(flow, STORED[:-2]))]
    script.append((EMIT, "store_error"))
    answer = run(flow.claim(), script).value
    assert isinstance(answer, Answer)
    assert answer.status == 503
    assert _slug(answer) == "idempotency-store-unavailable"
    assert _header(answer, b"retry-after") == b"4"


# -- someone else's request ----------------------------------------------------------------------


@pytest.mark.parametrize("state", ["completed", "in_progress"])
@pytest.mark.parametrize("on_conflict", ["reject", "wait"])
def test_a_different_request_is_422_even_while_the_first_runs(state: str, on_conflict: str) -> None:
    flow = flow_for(events=True, on_conflict=on_conflict)
    if state == "completed":
        reservation = completed(flow, STORED, same=False)
    else:
        reservation = in_progress(flow, same=False)
    answer = run(flow.claim(), [(RESERVE, None, reservation), (EMIT, "mismatch")]).value
    assert isinstance(answer, Answer)
    assert answer.status == 422
    assert _slug(answer) == "idempotency-key-reused"
    assert _header(answer, b"retry-after") is None


def test_a_mismatch_is_reported_for_the_log_even_without_a_hook() -> None:
    flow = flow_for()
    script = [(RESERVE, None, in_progress(flow, same=False)), (EMIT, "mismatch")]
    answer = run(flow.claim(), script).value
    assert answer.status == 422


@pytest.mark.parametrize("events", [False, True], ids=["no-hook", "hook"])
@pytest.mark.parametrize("on_conflict", ["reject", "wait"])
def test_a_committed_record_whose_lease_lapsed_is_409_outcome_unknown(
    events: bool, on_conflict: str
) -> None:
    flow = flow_for(events=events, on_conflict=on_conflict)
    script: list[tuple[object, ...]] = [(RESERVE, None, in_progress(flow, 0.0, committed=True))]
    script.append((EMIT, "outcome_unknown"))
    answer = run(flow.claim(), script).value
    assert isinstance(answer, Answer)
    assert answer.status == 409
    assert _slug(answer) == "idempotency-outcome-unknown"
    assert b"retrysafe resolve" in answer.body
    # Waiting cannot help: it will never finish; and no Retry-After promises that it will.
    assert _header(answer, b"retry-after") is None


@pytest.mark.parametrize(("remaining", "seconds"), [(12.5, b"13"), (0.2, b"1"), (30.0, b"30")])
def test_a_running_first_request_is_409_with_retry_after_from_its_remaining_lease(
    remaining: float, seconds: bytes
) -> None:
    flow = flow_for(events=True)
    script = [(RESERVE, None, in_progress(flow, remaining)), (EMIT, "conflict")]
    answer = run(flow.claim(), script).value
    assert isinstance(answer, Answer)
    assert answer.status == 409
    assert _slug(answer) == "idempotency-request-in-progress"
    assert _header(answer, b"retry-after") == seconds


def test_a_running_committed_request_is_an_ordinary_409_while_its_lease_runs() -> None:
    flow = flow_for()
    answer = run(flow.claim(), [(RESERVE, None, in_progress(flow, 3.0, committed=True))]).value
    assert _slug(answer) == "idempotency-request-in-progress"


# -- on_conflict="wait" --------------------------------------------------------------------------


def test_wait_sleeps_with_doubling_backoff_then_replays() -> None:
    flow = flow_for(on_conflict="wait", conflict_wait=10.0)
    busy = in_progress(flow, 5.0)
    result = run(
        flow.claim(),
        [
            (RESERVE, None, busy),
            (CLOCK, None, 100.0),
            (SLEEP, 0.01),
            (RESERVE, None, busy),
            (CLOCK, None, 100.01),
            (SLEEP, 0.02),
            (RESERVE, None, busy),
            (CLOCK, None, 100.03),
            (SLEEP, 0.04),
            (RESERVE, None, completed(flow, STORED)),
        ],
    )
    answer = result.value
    assert isinstance(answer, Answer)
    assert answer.status == 201
    assert (b"idempotency-replayed", b"true") in answer.headers


def test_wait_backoff_is_capped_at_a_quarter_second() -> None:
    flow = flow_for(on_conflict="wait", conflict_wait=10.0)
    busy = in_progress(flow, 5.0)
    script: list[tuple[object, ...]] = []
    for delay in (0.01, 0.02, 0.04, 0.08, 0.16, 0.25, 0.25, 0.25):
        script += [(RESERVE, None, busy), (CLOCK, None, 100.0), (SLEEP, delay)]
    script.append((RESERVE, None, completed(flow, STORED)))
    assert run(flow.claim(), script).value.status == 201


def test_wait_runs_the_request_when_the_first_one_released_the_key() -> None:
    flow = flow_for(on_conflict="wait")
    result = run(
        flow.claim(),
        [
            (RESERVE, None, in_progress(flow)),
            (CLOCK, None, 0.0),
            (SLEEP, 0.01),
            (RESERVE, None, won("tok-2")),
        ],
    )
    assert result.value == EXECUTE
    assert flow.token == "tok-2"


@pytest.mark.parametrize("events", [False, True], ids=["no-hook", "hook"])
def test_wait_answers_409_once_the_next_sleep_would_pass_the_deadline(events: bool) -> None:
    flow = flow_for(events=events, on_conflict="wait", conflict_wait=1.0)
    script: list[tuple[object, ...]] = [
        (RESERVE, None, in_progress(flow, 9.0)),
        (CLOCK, None, 50.0),  # the deadline is 51.0
        (SLEEP, 0.01),
        (RESERVE, None, in_progress(flow, 8.2)),
        (CLOCK, None, 50.99),  # 50.99 + 0.02 >= 51.0: no more sleeping
    ]
    if events:
        script.append((EMIT, "conflict"))
    answer = run(flow.claim(), script).value
    assert isinstance(answer, Answer)
    assert answer.status == 409
    assert _slug(answer) == "idempotency-request-in-progress"
    # Retry-After comes from the lease seen last, not the first.
    assert _header(answer, b"retry-after") == b"9"


def test_wait_answers_503_when_the_store_fails_while_waiting() -> None:
    flow = flow_for(on_conflict="wait")
    answer = run(
        flow.claim(),
        [
            (RESERVE, None, in_progress(flow)),
            (CLOCK, None, 0.0),
            (SLEEP, 0.01),
            (RESERVE, None, StoreUnavailableError("down")),
            (EMIT, "store_error"),
        ],
    ).value
    assert answer.status == 503


# -- the store fails -----------------------------------------------------------------------------


@pytest.mark.parametrize("error", [StoreError("bad answer"), StoreUnavailableError("refused")])
@pytest.mark.parametrize("events", [False, True], ids=["no-hook", "hook"])
def test_a_store_error_fails_closed_with_503_and_the_configured_retry_after(
    error: StoreError, events: bool
) -> None:
    flow = flow_for(events=events, store_retry_after=7)
    script: list[tuple[object, ...]] = [(RESERVE, None, error)]
    script.append((EMIT, "store_error"))
    answer = run(flow.claim(), script).value
    assert isinstance(answer, Answer)
    assert answer.status == 503
    assert _slug(answer) == "idempotency-store-unavailable"
    assert _header(answer, b"retry-after") == b"7"
    assert flow.token == ""


@pytest.mark.parametrize("events", [False, True], ids=["no-hook", "hook"])
def test_fail_open_runs_unprotected_and_reports_fail_open_only(events: bool) -> None:
    # fail_open, not store_error too: store_error means "answered 503" (metrics count it).
    flow = flow_for(events=events, on_store_error="fail_open", transactional=True)
    script: list[tuple[object, ...]] = [(RESERVE, None, StoreUnavailableError("down"))]
    script += [(EMIT, "fail_open")]
    assert run(flow.claim(), script).value == RUN_UNPROTECTED
    # Nothing is held: no token, no transaction to settle.
    assert flow.token == ""
    assert not flow.in_tx


def test_an_error_that_is_not_a_store_error_is_not_the_flows_to_handle() -> None:
    flow = flow_for(on_store_error="fail_open")
    with pytest.raises(ZeroDivisionError):
        run(flow.claim(), [(RESERVE, None, ZeroDivisionError())])


def test_a_reservation_without_token_or_record_is_a_store_contract_violation() -> None:
    flow = flow_for()
    with pytest.raises(ValueError, match="either a token or a record"):
        run(flow.claim(), [(RESERVE, None, Reservation())])
