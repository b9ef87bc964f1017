"""Admission (before the body is read) and the decision table of the claim.

:func:`admit` answers ``400`` and ``413`` or passes the parsed key on; :func:`decide` maps a
reservation outcome to what the claim does with it.
"""

from __future__ import annotations

import json

import pytest

from retrysafe import IdempotencyConfig
from retrysafe._core.http import Answer, admit, too_large
from retrysafe._core.operation import Decision, decide, retry_after
from retrysafe.stores import Record, Reservation

from .script import make_request

FP = "f" * 64


def _problem(answer: object) -> dict[str, object]:
    assert isinstance(answer, Answer)
    assert (b"content-type", b"application/problem+json") in answer.headers
    assert (b"content-length", str(len(answer.body)).encode()) in answer.headers
    body: dict[str, object] = json.loads(answer.body)
    assert body["status"] == answer.status
    return body


# -- admit ---------------------------------------------------------------------------------------


def test_no_key_on_an_optional_route_runs_unprotected() -> None:
    assert admit(make_request(keys=[]), IdempotencyConfig()) is None


def test_no_key_on_a_required_route_is_400_missing() -> None:
    answer = admit(make_request(keys=[]), IdempotencyConfig(required=True))
    body = _problem(answer)
    assert isinstance(answer, Answer)
    assert answer.status == 400
    assert answer.event == "missing_key"
    assert body["type"] == "urn:retrysafe:problem:idempotency-key-missing"


@pytest.mark.parametrize(
    ("keys", "reason"),
    [
        ([b""], "empty"),
        ([b"a b"], "bare key"),
        ([b"x" * 256], "longer than 255"),
        ([b"a", b"b"], "exactly once"),
        ([b"\xff"], "printable ASCII"),
    ],
    ids=["empty", "space", "too-long", "two-fields", "not-ascii"],
)
def test_a_malformed_key_is_400_invalid_with_the_reason(keys: list[bytes], reason: str) -> None:
    answer = admit(make_request(keys=keys), IdempotencyConfig())
    body = _problem(answer)
    assert isinstance(answer, Answer)
    assert answer.status == 400
    assert answer.event == "invalid_key"
    assert body["type"] == "urn:retrysafe:problem:idempotency-key-invalid"
    assert reason in str(body["detail"])
    assert str(body["detail"]).endswith(".")


def test_a_malformed_key_is_400_even_on_a_route_that_does_not_require_one() -> None:
    answer = admit(make_request(keys=[b'"open']), IdempotencyConfig(required=False))
    assert isinstance(answer, Answer)
    assert answer.status == 400


def test_a_declared_body_over_the_limit_is_413() -> None:
    answer = admit(make_request(content_length=101), IdempotencyConfig(max_body_size=100))
    body = _problem(answer)
    assert isinstance(answer, Answer)
    assert answer.status == 413
    assert answer.event == "too_large"
    assert body["type"] == "urn:retrysafe:problem:idempotency-request-too-large"
    assert "100 bytes" in str(body["detail"])


@pytest.mark.parametrize("length", [-1, 0, 100])
def test_a_body_at_the_limit_or_of_unknown_length_is_admitted(length: int) -> None:
    config = IdempotencyConfig(max_body_size=100)
    assert admit(make_request(content_length=length), config) == "k-1"


def test_the_key_is_checked_before_the_declared_length() -> None:
    config = IdempotencyConfig(max_body_size=10)
    answer = admit(make_request(keys=[b""], content_length=11), config)
    assert isinstance(answer, Answer)
    assert answer.status == 400


@pytest.mark.parametrize(("raw", "key"), [(b'"ab c"', "ab c"), (b"  abc ", "abc")])
def test_an_admitted_request_gets_its_parsed_key(raw: bytes, key: str) -> None:
    assert admit(make_request(keys=[raw]), IdempotencyConfig()) == key


def test_too_large_is_the_413_answer_shells_send_while_reading_the_body() -> None:
    answer = too_large(IdempotencyConfig(max_body_size=5))
    assert answer.status == 413
    assert answer.event == "too_large"
    assert b"5 bytes" in answer.body


def test_problem_answers_carry_the_configured_type_base_and_documentation_link() -> None:
    config = IdempotencyConfig(
        required=True, problem_type_base="https://err.example/", documentation_url="https://d/"
    )
    answer = admit(make_request(keys=[]), config)
    body = _problem(answer)
    assert isinstance(answer, Answer)
    assert body["type"] == "https://err.example/idempotency-key-missing"
    assert (b"link", b'<https://d/>; rel="describedby"') in answer.headers
    assert not any(name == b"retry-after" for name, _ in answer.headers)


def test_request_header_lookup_is_case_insensitive_and_returns_the_first_value() -> None:
    request = make_request(headers=[(b"x-a", b"1"), (b"x-a", b"2")])
    assert request.header("X-A") == "1"
    assert request.header("x-b") is None
    assert repr(request) == "<Request POST /orders>"


# -- decide --------------------------------------------------------------------------------------


def _record(fingerprint: str = FP, **fields: object) -> Reservation:
    return Reservation(record=Record(fingerprint, **fields))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("reservation", "decision"),
    [
        (Reservation(token="t"), Decision.EXECUTE),
        (_record(state="completed", response=b"r"), Decision.REPLAY),
        (_record(state="completed", response=b"r", committed=True), Decision.REPLAY),
        (_record(state="in_progress", lease_remaining=3.0), Decision.IN_PROGRESS),
        (_record(state="in_progress", lease_remaining=3.0, committed=True), Decision.IN_PROGRESS),
        (
            _record(state="in_progress", lease_remaining=0.0, committed=True),
            Decision.OUTCOME_UNKNOWN,
        ),
        (_record("other", state="completed", response=b"r"), Decision.MISMATCH),
        (_record("other", state="in_progress", lease_remaining=3.0), Decision.MISMATCH),
        (_record("other", state="in_progress", committed=True), Decision.MISMATCH),
    ],
    ids=[
        "won",
        "completed-same",
        "completed-committed",
        "running-same",
        "running-committed",
        "committed-lapsed",
        "completed-other",
        "running-other",
        "unknown-other",
    ],
)
def test_decide_maps_every_reservation_outcome(
    reservation: Reservation, decision: Decision
) -> None:
    assert decide(reservation, FP) is decision


def test_a_won_reservation_executes_whatever_the_fingerprint() -> None:
    assert decide(Reservation(token="t"), "anything") is Decision.EXECUTE


@pytest.mark.parametrize(
    ("remaining", "seconds"),
    [(0.0, 1), (0.001, 1), (0.999, 1), (1.0, 1), (1.01, 2), (29.5, 30), (30.0, 30)],
)
def test_retry_after_rounds_up_to_whole_seconds_and_is_at_least_one(
    remaining: float, seconds: int
) -> None:
    assert retry_after(remaining) == seconds
