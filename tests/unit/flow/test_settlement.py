"""The settlement: the handler's response is final. Status policy, the fenced completion, the
stored encoding, outcome unknown, release, the deferred completion, the transactional commit, and
what happens when the handler raised (:meth:`Flow.failed`) or never finished."""

from __future__ import annotations

import json
from collections.abc import Callable, Generator
from typing import Any

import pytest

from retrysafe import StoreError, StoreUnavailableError
from retrysafe._core.codec import decode_response
from retrysafe._core.http import Answer, Flow
from retrysafe._core.operation import (
    COMPLETE,
    DEFER,
    EMIT,
    FINALIZE,
    MARK_COMMITTED,
    RELEASE,
    TX_CLOSE,
    TX_COMPLETE,
    TX_ROLLBACK,
    TX_STATE,
)

from .script import ANY, Events, claimed, run

HEADERS = [(b"content-type", b"application/json"), (b"location", b"/orders/7")]
BODY = b'{"id":7}'


def _slug(answer: object) -> str:
    assert isinstance(answer, Answer)
    return str(json.loads(answer.body)["type"]).rsplit(":", 1)[-1]


def _retry_after(answer: Answer) -> bytes | None:
    return dict(answer.headers).get(b"retry-after")


def _committed(flow: Flow) -> Flow:
    """The handler declared its effects committed (outside any transaction)."""
    script: list[tuple[object, ...]] = []
    if flow.in_tx:
        script.append((TX_STATE, None, (False, False)))
    script.append((MARK_COMMITTED, flow.config.lease, True))
    assert run(flow.mark_committed(), script).value is True
    assert flow.committed
    return flow


# -- plain mode: the status policy ---------------------------------------------------------------


Settle = Callable[..., Generator[Any, Any, Any]]


@pytest.fixture(params=["settle", "settle_plain"])
def settle(request: pytest.FixtureRequest) -> Settle:
    """Plain mode is settled through :meth:`Flow.settle` or, on the runners' hot path, through
    :meth:`Flow.settle_plain`: both must behave alike."""
    name: str = request.param
    return lambda flow, *args: getattr(flow, name)(*args)


@pytest.mark.parametrize("status", [200, 201, 302, 404])
def test_a_stored_status_completes_the_record_with_the_encoded_response(
    settle: Settle, status: int
) -> None:
    flow = claimed()
    result = run(settle(flow, status, HEADERS, BODY, False), [(COMPLETE, ANY, True)])
    assert result.value is None
    stored = decode_response(result.actions[0][1])
    assert stored.status == status
    assert stored.headers == tuple(HEADERS)
    assert stored.body == BODY
    assert not stored.body_omitted


def test_an_omitted_body_is_stored_as_omitted(settle: Settle) -> None:
    flow = claimed()
    result = run(settle(flow, 200, (), b"", True), [(COMPLETE, ANY, True)])
    stored = decode_response(result.actions[0][1])
    assert stored.body_omitted
    assert stored.body == b""


@pytest.mark.parametrize("status", [400, 409, 422, 429, 500, 503])
def test_a_released_status_frees_the_key(settle: Settle, status: int) -> None:
    flow = claimed()
    assert run(settle(flow, status, HEADERS, BODY, False), [(RELEASE, None, True)]).value is None


def test_custom_release_statuses_decide_what_is_stored(settle: Settle) -> None:
    flow = claimed(release_statuses=frozenset({404}))
    run(settle(flow, 404, HEADERS, BODY, False), [(RELEASE, None, True)])
    flow = claimed(release_statuses=frozenset({404}))
    run(settle(flow, 409, HEADERS, BODY, False), [(COMPLETE, ANY, True)])


def test_server_errors_are_stored_when_configured(settle: Settle) -> None:
    flow = claimed(store_server_errors=True)
    result = run(settle(flow, 500, HEADERS, BODY, False), [(COMPLETE, ANY, True)])
    assert decode_response(result.actions[0][1]).status == 500


def test_a_release_the_store_refuses_is_left_to_the_lease(settle: Settle) -> None:
    flow = claimed(events=True)
    # No event, no raise: the lease lapses on its own.
    script = [(RELEASE, None, StoreUnavailableError("down"))]
    assert run(settle(flow, 500, HEADERS, BODY, False), script).value is None


@pytest.mark.parametrize("events", [False, True], ids=["no-hook", "hook"])
def test_committed_effects_then_a_released_status_declare_the_outcome_unknown(
    settle: Settle,
    events: bool,
) -> None:
    flow = _committed(claimed(events=events))
    script: list[tuple[object, ...]] = []
    script.append((EMIT, "outcome_unknown"))
    # Never RELEASE: the effects happened. The lease is ended (0 s) so retries learn it at once.
    script.append((MARK_COMMITTED, 0.0, True))
    assert run(settle(flow, 500, HEADERS, BODY, False), script).value is None


def test_an_unknown_outcome_the_store_cannot_record_is_left_to_the_lease(settle: Settle) -> None:
    flow = _committed(claimed())
    script = [(EMIT, "outcome_unknown"), (MARK_COMMITTED, 0.0, StoreError("down"))]
    assert run(settle(flow, 500, HEADERS, BODY, False), script).value is None


def test_committed_effects_with_a_stored_status_complete_as_usual(settle: Settle) -> None:
    flow = _committed(claimed())
    assert run(settle(flow, 201, HEADERS, BODY, False), [(COMPLETE, ANY, True)]).value is None


@pytest.mark.parametrize("events", [False, True], ids=["no-hook", "hook"])
def test_a_completion_the_store_refuses_is_deferred_with_the_same_bytes(
    settle: Settle, events: bool
) -> None:
    flow = claimed(events=events)
    script: list[tuple[object, ...]] = [(COMPLETE, ANY, StoreUnavailableError("down"))]
    script.append((EMIT, "completion_deferred"))
    script.append((DEFER, ANY))
    result = run(settle(flow, 201, HEADERS, BODY, False), script)
    assert result.value is None
    # What is retried in the background is exactly what the first attempt tried to store.
    assert result.actions[-1][1] == result.actions[0][1]


@pytest.mark.parametrize("events", [False, True], ids=["no-hook", "hook"])
def test_a_fenced_out_completion_reports_the_lost_lease(settle: Settle, events: bool) -> None:
    flow = claimed(events=events)
    script: list[tuple[object, ...]] = [(COMPLETE, ANY, False)]
    script.append((EMIT, "lease_lost"))
    # The response still goes out (it is the handler's); only the record was not ours.
    assert run(settle(flow, 201, HEADERS, BODY, False), script).value is None


def test_the_flow_asks_for_events_and_never_calls_the_hook_itself(settle: Settle) -> None:
    hook = Events()
    flow = claimed(hook=hook)
    script = [(COMPLETE, ANY, False), (EMIT, "lease_lost")]
    run(settle(flow, 201, HEADERS, BODY, False), script)
    # EMIT is an action: the runner, not the flow, calls the hook.
    assert hook.calls == []


# -- the stored encoding: header deny and allow lists --------------------------------------------


def _stored_headers(flow: Flow, headers: list[tuple[bytes, bytes]]) -> tuple[object, ...]:
    result = run(flow.settle(201, headers, BODY, False), [(COMPLETE, ANY, True)])
    return decode_response(result.actions[0][1]).headers


MIXED = [
    (b"Content-Type", b"application/json"),
    (b"Set-Cookie", b"sid=secret"),
    (b"Date", b"Tue, 01 Dec 2026 10:00:00 GMT"),
    (b"ETag", b'"v1"'),
    (b"Authorization", b"Bearer x"),
    (b"Transfer-Encoding", b"chunked"),
    (b"X-Trace", b"abc"),
]


def test_the_default_denylist_drops_credentials_cookies_and_hop_by_hop_headers() -> None:
    assert _stored_headers(claimed(), MIXED) == (
        (b"content-type", b"application/json"),
        (b"etag", b'"v1"'),
        (b"x-trace", b"abc"),
    )


def test_a_custom_denylist_is_matched_case_insensitively() -> None:
    flow = claimed(replay_header_denylist=frozenset({"X-Trace"}))
    assert _stored_headers(flow, MIXED) == (
        (b"content-type", b"application/json"),
        (b"set-cookie", b"sid=secret"),
        (b"date", b"Tue, 01 Dec 2026 10:00:00 GMT"),
        (b"etag", b'"v1"'),
        (b"authorization", b"Bearer x"),
        (b"transfer-encoding", b"chunked"),
    )


def test_an_allowlist_keeps_only_its_headers_and_the_denylist_still_wins() -> None:
    flow = claimed(replay_header_allowlist=frozenset({"ETag", "set-cookie", "Content-Type"}))
    assert _stored_headers(flow, MIXED) == (
        (b"content-type", b"application/json"),
        (b"etag", b'"v1"'),
    )


# -- transactional mode --------------------------------------------------------------------------


def test_a_begun_transaction_completes_and_commits_on_the_handlers_connection() -> None:
    flow = claimed(transactional=True)
    script = [
        (FINALIZE, True),
        (TX_STATE, None, (True, False)),
        (TX_COMPLETE, ANY, True),
        (TX_CLOSE, None),
    ]
    result = run(flow.settle(201, HEADERS, BODY, False), script)
    assert result.value is None
    assert decode_response(result.actions[2][1]).body == BODY
    assert not flow.in_tx
    assert flow.finish() is None  # nothing left open


def test_a_failing_finalizer_abandons_the_request_and_propagates() -> None:
    flow = claimed(transactional=True)
    script = [
        (FINALIZE, True, LookupError("unique constraint")),
        (FINALIZE, False),
        (TX_ROLLBACK, None),
        (TX_CLOSE, None),
        (RELEASE, None, True),
    ]
    with pytest.raises(LookupError, match="unique constraint"):
        run(flow.settle(201, HEADERS, BODY, False), script)
    assert not flow.in_tx


def test_finalizers_learn_that_a_released_status_will_not_commit() -> None:
    flow = claimed(transactional=True)
    script = [
        (FINALIZE, False),
        (TX_STATE, None, (True, False)),
        (TX_ROLLBACK, None),
        (TX_CLOSE, None),
        (RELEASE, None, True),
    ]
    assert run(flow.settle(409, HEADERS, BODY, False), script).value is None
    assert not flow.in_tx


@pytest.mark.parametrize("events", [False, True], ids=["no-hook", "hook"])
def test_a_released_status_from_a_broken_connection_is_503(events: bool) -> None:
    flow = claimed(transactional=True, events=events, store_retry_after=3)
    script: list[tuple[object, ...]] = [
        (FINALIZE, False),
        (TX_STATE, None, (True, True)),
        (TX_ROLLBACK, None, StoreError("connection is closed")),
        (TX_CLOSE, None, StoreError("connection is closed")),
        (RELEASE, None, True),
    ]
    script.append((EMIT, "store_error"))
    answer = run(flow.settle(500, HEADERS, BODY, False), script).value
    assert isinstance(answer, Answer)
    assert answer.status == 503
    assert _slug(answer) == "idempotency-store-unavailable"
    assert b"connection was lost" in answer.body
    assert _retry_after(answer) == b"3"


def test_a_released_status_after_an_effect_outside_the_transaction_is_outcome_unknown() -> None:
    flow = _committed(claimed(transactional=True))
    script = [
        (FINALIZE, False),
        (TX_STATE, None, (False, False)),
        (TX_ROLLBACK, None),
        (TX_CLOSE, None),
        (EMIT, "outcome_unknown"),
        (MARK_COMMITTED, 0.0, True),
    ]
    assert run(flow.settle(500, HEADERS, BODY, False), script).value is None


def test_a_transaction_never_begun_ends_in_a_plain_completion() -> None:
    flow = claimed(transactional=True)
    script = [
        (FINALIZE, True),
        (TX_STATE, None, (False, False)),
        (TX_CLOSE, None),
        (COMPLETE, ANY, True),
    ]
    assert run(flow.settle(201, HEADERS, BODY, False), script).value is None
    assert not flow.in_tx


def test_a_transaction_never_begun_defers_a_refused_completion_like_plain_mode() -> None:
    flow = claimed(transactional=True)
    script = [
        (FINALIZE, True),
        (TX_STATE, None, (False, False)),
        (TX_CLOSE, None),
        (COMPLETE, ANY, StoreError("down")),
        (EMIT, "completion_deferred"),
        (DEFER, ANY),
    ]
    assert run(flow.settle(201, HEADERS, BODY, False), script).value is None


@pytest.mark.parametrize("events", [False, True], ids=["no-hook", "hook"])
def test_a_commit_that_fails_releases_and_answers_503(events: bool) -> None:
    flow = claimed(transactional=True, events=events, store_retry_after=2)
    script: list[tuple[object, ...]] = [
        (FINALIZE, True),
        (TX_STATE, None, (True, False)),
        (TX_COMPLETE, ANY, StoreUnavailableError("terminated")),
        (TX_CLOSE, None),
        (RELEASE, None, False),
    ]
    script.append((EMIT, "store_error"))
    answer = run(flow.settle(201, HEADERS, BODY, False), script).value
    assert isinstance(answer, Answer)
    assert answer.status == 503
    assert b"could not be committed" in answer.body
    assert _retry_after(answer) == b"2"


def test_a_failed_commit_after_an_effect_outside_the_transaction_never_frees_the_key() -> None:
    # The handler charged a card (mark_committed before it touched the transaction), then
    # wrote its rows; the commit fails. The charge happened: the key must end "outcome
    # unknown" (as every other path does once committed), not be released for a rerun.
    flow = _committed(claimed(transactional=True))
    script = [
        (FINALIZE, True),
        (TX_STATE, None, (True, False)),
        (TX_COMPLETE, ANY, StoreUnavailableError("terminated")),
        (TX_CLOSE, None),
        (EMIT, "outcome_unknown"),
        (MARK_COMMITTED, 0.0, True),
        (EMIT, "store_error"),
    ]
    answer = run(flow.settle(201, HEADERS, BODY, False), script).value
    assert answer.status == 503


@pytest.mark.parametrize("events", [False, True], ids=["no-hook", "hook"])
def test_a_fenced_out_commit_is_409_with_retry_after_of_a_whole_lease(events: bool) -> None:
    flow = claimed(transactional=True, events=events, lease=20.0)
    script: list[tuple[object, ...]] = [
        (FINALIZE, True),
        (TX_STATE, None, (True, False)),
        (TX_COMPLETE, ANY, False),
        (TX_CLOSE, None),
    ]
    script.append((EMIT, "lease_lost"))
    answer = run(flow.settle(201, HEADERS, BODY, False), script).value
    assert isinstance(answer, Answer)
    assert answer.status == 409
    assert _slug(answer) == "idempotency-request-in-progress"
    assert b"rolled back" in answer.body
    assert _retry_after(answer) == b"20"


# -- the handler raised: failed() ----------------------------------------------------------------


@pytest.mark.parametrize("events", [False, True], ids=["no-hook", "hook"])
def test_a_store_error_before_the_response_started_is_503(events: bool) -> None:
    flow = claimed(events=events, store_retry_after=5)
    script: list[tuple[object, ...]] = [(RELEASE, None, True)]
    script.append((EMIT, "store_error"))
    answer = run(flow.failed(StoreUnavailableError("pool timeout"), False), script).value
    assert isinstance(answer, Answer)
    assert answer.status == 503
    assert _retry_after(answer) == b"5"


def test_a_transaction_that_could_not_begin_is_503_after_giving_everything_back() -> None:
    flow = claimed(transactional=True)
    script = [
        (FINALIZE, False),
        (TX_ROLLBACK, None),
        (TX_CLOSE, None),
        (RELEASE, None, True),
        (EMIT, "store_error"),
    ]
    answer = run(flow.failed(StoreError("database is locked"), False), script).value
    assert answer.status == 503
    assert not flow.in_tx


def test_a_store_error_after_the_response_started_is_re_raised() -> None:
    flow = claimed()
    result = run(flow.failed(StoreError("late"), True), [(RELEASE, None, True)])
    assert result.value is None


@pytest.mark.parametrize("events", [False, True], ids=["no-hook", "hook"])
def test_a_handler_error_from_a_broken_transaction_is_503(events: bool) -> None:
    flow = claimed(transactional=True, events=events)
    script: list[tuple[object, ...]] = [
        (TX_STATE, None, (True, True)),
        (FINALIZE, False),
        (TX_ROLLBACK, None),
        (TX_CLOSE, None),
        (RELEASE, None, True),
    ]
    script.append((EMIT, "store_error"))
    answer = run(flow.failed(RuntimeError("server closed the connection"), False), script).value
    assert isinstance(answer, Answer)
    assert answer.status == 503
    assert b"connection was lost" in answer.body


def test_a_handler_error_with_a_healthy_transaction_abandons_and_re_raises() -> None:
    flow = claimed(transactional=True)
    script = [
        (TX_STATE, None, (True, False)),
        (FINALIZE, False),
        (TX_ROLLBACK, None),
        (TX_CLOSE, None),
        (RELEASE, None, True),
    ]
    assert run(flow.failed(ValueError("bug"), False), script).value is None


class _Cancelled(BaseException):
    """Like a task cancellation: not an ``Exception``."""


def test_a_cancellation_is_not_taken_for_a_broken_connection() -> None:
    flow = claimed(transactional=True)
    script = [(FINALIZE, False), (TX_ROLLBACK, None), (TX_CLOSE, None), (RELEASE, None, True)]
    assert run(flow.failed(_Cancelled(), False), script).value is None


def test_a_handler_error_after_the_response_started_skips_the_connection_check() -> None:
    flow = claimed(transactional=True)
    script = [(FINALIZE, False), (TX_ROLLBACK, None), (TX_CLOSE, None), (RELEASE, None, True)]
    assert run(flow.failed(ValueError("bug"), True), script).value is None


def test_a_plain_handler_error_frees_the_key_and_is_re_raised() -> None:
    flow = claimed()
    assert run(flow.failed(ValueError("bug"), False), [(RELEASE, None, True)]).value is None


def test_a_handler_error_after_committed_effects_declares_the_outcome_unknown() -> None:
    flow = _committed(claimed(events=True))
    script = [(EMIT, "outcome_unknown"), (MARK_COMMITTED, 0.0, True)]
    assert run(flow.failed(ValueError("bug"), True), script).value is None


def test_a_finalizer_failing_while_abandoning_is_logged_and_the_rest_still_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    flow = claimed(transactional=True)
    script = [
        (FINALIZE, False, OSError("session close failed")),
        (TX_ROLLBACK, None),
        (TX_CLOSE, None),
        (RELEASE, None, True),
    ]
    assert run(flow.failed(ValueError("bug"), True), script).value is None
    assert "a finalizer of" in caplog.text


# -- the handler never finished, the request ends -------------------------------------------------


def test_an_incomplete_response_frees_the_key() -> None:
    flow = claimed()
    assert run(flow.incomplete(), [(RELEASE, None, True)]).value is None


def test_an_incomplete_response_after_committed_effects_is_outcome_unknown() -> None:
    flow = _committed(claimed())
    script = [(EMIT, "outcome_unknown"), (MARK_COMMITTED, 0.0, True)]
    assert run(flow.incomplete(), script).value is None


def test_finish_gives_back_a_transaction_left_open_once() -> None:
    flow = claimed(transactional=True)
    run(flow.finish(), [(TX_CLOSE, None, StoreError("already gone"))])
    assert not flow.in_tx
    assert flow.finish() is None


def test_finish_has_nothing_to_do_in_plain_mode_without_a_hook() -> None:
    assert claimed().finish() is None


def test_finish_reports_settled_to_a_hook() -> None:
    assert run(claimed(events=True).finish(), [(EMIT, "settled")]).actions == [(EMIT, "settled")]
