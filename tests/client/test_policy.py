"""RetryPolicy, branch by branch, with no network: attempts are scripted into the call."""

from __future__ import annotations

import email.utils
import json
import logging
import random
import uuid

import pytest

from retrysafe import ConfigurationError, IdempotencyError
from retrysafe.client import (
    Failure,
    KeyReusedError,
    OutcomeUnknownError,
    RetriesExhaustedError,
    RetryPolicy,
    parse_retry_after,
)

from ..clock import FakeClock

PROBLEM = {"content-type": "application/problem+json"}


def problem(slug: str, base: str = "urn:retrysafe:problem:") -> bytes:
    return json.dumps({"type": base + slug, "title": "t", "status": 409, "detail": "why"}).encode()


def policy(**kwargs: object) -> RetryPolicy:
    clock = FakeClock()
    defaults: dict[str, object] = {"rng": random.Random(1), "clock": clock, "wall_clock": clock}
    return RetryPolicy(**{**defaults, **kwargs})  # type: ignore[arg-type]


# --- keys -------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["POST", "PATCH", "post"])
def test_post_and_patch_get_a_uuid4_sf_string_key(method: str) -> None:
    call = policy().start(method, "http://h/orders")
    assert call.key is not None
    assert uuid.UUID(call.key).version == 4
    assert call.header_to_add == f'"{call.key}"'


def test_every_call_gets_its_own_key_and_keeps_it_across_attempts() -> None:
    p = policy()
    first, second = p.start("POST"), p.start("POST")
    assert first.key != second.key
    key = first.key
    for _ in range(3):
        first.attempt()
        assert first.on_error(Failure.LOST).action == "retry"
    assert first.key == key
    assert first.info().attempts == 3


@pytest.mark.parametrize(("header", "key"), [('"mine-1"', "mine-1"), ("bare-2", "bare-2")])
def test_a_caller_key_is_used_as_is(header: str, key: str) -> None:
    call = policy().start("POST", key_header=header)
    assert call.header_to_add is None
    assert call.key == key


def test_get_gets_no_key_but_is_retried() -> None:
    call = policy().start("GET")
    assert call.key is None and call.header_to_add is None
    call.attempt()
    assert call.on_error(Failure.LOST).action == "retry"


def test_add_keys_off_leaves_post_without_key_and_never_resends_a_sent_one() -> None:
    call = policy(add_keys=False).start("POST")
    assert call.key is None
    call.attempt()
    lost = call.on_error(Failure.LOST)
    assert lost.action == "raise" and lost.error is None  # re-raise the transport error
    # ... but a request that never left may be sent again, key or not.
    assert call.on_error(Failure.NOT_SENT).action == "retry"
    assert call.on_response(503, {}).action == "return"


def test_a_streamed_body_is_sent_once() -> None:
    call = policy().start("POST", replayable=False)
    call.attempt()
    assert call.on_error(Failure.LOST).action == "raise"
    assert call.on_error(Failure.NOT_SENT).action == "raise"
    assert call.on_response(503, {}).reason == "not_resendable"


def test_other_methods_are_not_resent_once_sent() -> None:
    call = policy().start("CONNECT")
    call.attempt()
    assert call.key is None
    assert call.on_error(Failure.LOST).action == "raise"


# --- statuses ---------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [200, 201, 204, 301, 400, 401, 404, 422])
def test_final_statuses_are_returned_and_settle_the_key(status: int) -> None:
    call = policy().start("POST")
    call.attempt()
    decision = call.on_response(status, {"content-type": "application/json"}, b"{}")
    assert decision.action == "return"
    assert decision.settled


@pytest.mark.parametrize("status", [500, 501, 429])
def test_statuses_outside_retry_statuses_are_returned_unsettled(status: int) -> None:
    call = policy().start("POST")
    call.attempt()
    decision = call.on_response(status, {})
    assert decision.action == "return" and not decision.settled


@pytest.mark.parametrize("status", [502, 503, 504])
def test_gateway_and_unavailable_statuses_are_retried(status: int) -> None:
    call = policy().start("POST")
    call.attempt()
    decision = call.on_response(status, {})
    assert decision.action == "retry"
    assert 0 <= decision.delay <= 0.25


def test_retry_statuses_is_configurable() -> None:
    call = policy(retry_statuses=frozenset({429})).start("POST")
    call.attempt()
    assert call.on_response(429, {"retry-after": "2"}).delay == 2
    assert call.on_response(503, {}).action == "return"


def test_409_in_progress_is_waited_out_with_its_retry_after() -> None:
    call = policy().start("POST")
    call.attempt()
    body = problem("idempotency-request-in-progress")
    decision = call.on_response(409, {**PROBLEM, "retry-after": "3"}, body)
    assert (decision.action, decision.delay) == ("retry", 3)


def test_409_in_progress_is_recognized_under_any_problem_type_base() -> None:
    call = policy().start("POST")
    call.attempt()
    body = problem("idempotency-request-in-progress", base="https://errors.example/")
    assert call.on_response(409, PROBLEM, body).action == "retry"


def test_409_outcome_unknown_raises_with_the_key_and_detail() -> None:
    call = policy().start("POST")
    call.attempt()
    decision = call.on_response(409, PROBLEM, problem("idempotency-outcome-unknown"))
    assert decision.action == "raise"
    assert isinstance(decision.error, OutcomeUnknownError)
    assert isinstance(decision.error, IdempotencyError)
    assert decision.error.key == call.key
    assert decision.error.detail == "why"
    assert decision.error.attempts == 1


def test_422_key_reused_raises_with_the_key() -> None:
    call = policy().start("POST", key_header='"k"')
    call.attempt()
    decision = call.on_response(422, PROBLEM, problem("idempotency-key-reused"))
    assert isinstance(decision.error, KeyReusedError)
    assert decision.error.key == "k"


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        ({"content-type": "application/json"}, b'{"error": "conflict"}'),  # no problem type
        (PROBLEM, b"not json"),
        ({"content-type": "text/plain"}, problem("idempotency-request-in-progress")),
        (PROBLEM, None),
    ],
)
def test_any_other_409_is_returned_not_retried(headers: dict[str, str], body: bytes | None) -> None:
    call = policy().start("POST")
    call.attempt()
    assert call.on_response(409, headers, body).action == "return"


def test_only_409_and_422_bodies_are_wanted() -> None:
    call = policy().start("POST")
    assert call.wants_body(409) and call.wants_body(422)
    assert not call.wants_body(201) and not call.wants_body(503)


@pytest.mark.parametrize("name", ["Idempotency-Replayed", "Idempotent-Replayed"])
def test_replayed_header_is_reported(name: str) -> None:
    call = policy().start("POST")
    call.attempt()
    call.on_response(201, {name.lower(): "true"})
    assert call.info().replayed
    fresh = policy().start("POST")
    fresh.attempt()
    fresh.on_response(201, {})
    assert not fresh.info().replayed


# --- exceptions -------------------------------------------------------------------------------


@pytest.mark.parametrize("failure", [Failure.NOT_SENT, Failure.LOST])
def test_network_failures_are_retried_for_keyed_posts(failure: Failure) -> None:
    call = policy().start("POST")
    call.attempt()
    assert call.on_error(failure, "ReadTimeout").action == "retry"


def test_fatal_errors_are_reraised_at_once() -> None:
    call = policy().start("POST")
    call.attempt()
    decision = call.on_error(Failure.FATAL, "UnsupportedProtocol")
    assert (decision.action, decision.error) == ("raise", None)


def test_max_attempts_ends_in_retries_exhausted_with_the_key() -> None:
    call = policy(max_attempts=3).start("POST")
    decisions = []
    for _ in range(3):
        call.attempt()
        decisions.append(call.on_error(Failure.LOST, "ReadError"))
    assert [d.action for d in decisions] == ["retry", "retry", "raise"]
    error = decisions[-1].error
    assert isinstance(error, RetriesExhaustedError)
    assert (error.key, error.attempts, error.reason) == (call.key, 3, "max_attempts")


def test_max_attempts_on_statuses_returns_the_last_response() -> None:
    call = policy(max_attempts=2).start("POST")
    call.attempt()
    assert call.on_response(503, {}).action == "retry"
    call.attempt()
    assert call.on_response(503, {}).reason == "max_attempts"


def test_deadline_stops_retries_before_a_wait_would_pass_it() -> None:
    clock = FakeClock()
    p = policy(deadline=10.0, clock=clock, max_attempts=100)
    call = p.start("POST")
    call.attempt()
    assert call.on_response(503, {"retry-after": "4"}).action == "retry"
    clock.now += 4
    call.attempt()
    assert call.on_response(503, {"retry-after": "6"}).action == "retry"  # lands at 10 exactly
    clock.now += 6
    call.attempt()
    assert call.on_response(503, {"retry-after": "1"}).reason == "deadline"
    decision = call.on_error(Failure.LOST)
    assert isinstance(decision.error, RetriesExhaustedError)
    assert decision.error.reason == "deadline"


def test_a_retry_after_beyond_max_retry_after_is_not_waited_for() -> None:
    call = policy(max_retry_after=5).start("POST")
    call.attempt()
    assert call.on_response(503, {"retry-after": "6"}).reason == "retry_after_too_long"


# --- Retry-After ------------------------------------------------------------------------------


def test_retry_after_seconds() -> None:
    assert parse_retry_after("7", now=0) == 7
    assert parse_retry_after(" 0 ", now=0) == 0


def test_retry_after_http_date_is_relative_to_now() -> None:
    now = 1_800_000_000.0
    date = email.utils.formatdate(now + 12, usegmt=True)
    assert parse_retry_after(date, now=now) == pytest.approx(12)
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0


@pytest.mark.parametrize("value", [None, "", "-1", "1.5", "soon", "Wed, 99 Foo 2026", "1e3"])
def test_retry_after_malformed_is_none(value: str | None) -> None:
    assert parse_retry_after(value, now=0) is None


def test_http_date_retry_after_drives_the_delay() -> None:
    clock = FakeClock()
    call = policy(wall_clock=clock).start("POST")
    call.attempt()
    date = email.utils.formatdate(clock.now + 9, usegmt=True)
    assert call.on_response(503, {"retry-after": date}).delay == pytest.approx(9)


def test_malformed_retry_after_falls_back_to_backoff() -> None:
    call = policy(backoff_initial=0.5).start("POST")
    call.attempt()
    decision = call.on_response(503, {"retry-after": "later"})
    assert decision.action == "retry" and 0 <= decision.delay <= 0.5


# --- backoff ----------------------------------------------------------------------------------


def test_full_jitter_stays_within_the_capped_exponential_bound() -> None:
    p = policy(backoff_initial=0.5, backoff_max=4.0, rng=random.Random(2026))
    for retry, cap in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 4.0), (40, 4.0), (500, 4.0)]:
        samples = [p.backoff(retry) for _ in range(400)]
        assert all(0 <= s <= cap for s in samples)
        # Full jitter spreads over the whole range, not just near the cap.
        assert min(samples) < cap * 0.1 and max(samples) > cap * 0.9


def test_seeded_jitter_is_reproducible() -> None:
    a = policy(rng=random.Random(5))
    b = policy(rng=random.Random(5))
    c = policy(rng=random.Random(6))
    seq_a = [a.backoff(n) for n in range(1, 8)]
    assert seq_a == [b.backoff(n) for n in range(1, 8)]
    assert seq_a != [c.backoff(n) for n in range(1, 8)]


# --- events -----------------------------------------------------------------------------------


def test_events_tell_attempt_retry_done_without_the_raw_key() -> None:
    events: list[tuple[str, dict[str, object]]] = []
    call = policy(on_event=lambda e, d: events.append((e, d))).start("POST", "http://h/o?secret=1")
    call.attempt()
    call.on_error(Failure.LOST, "ReadError")
    call.attempt()
    call.on_response(201, {"idempotency-replayed": "true"})
    assert [e for e, _ in events] == ["attempt", "retry", "attempt", "done"]
    assert events[1][1]["error"] == "ReadError" and events[1][1]["reason"] == "lost"
    assert events[3][1]["replayed"] is True
    assert all(d["url"] == "http://h/o" for _, d in events)
    assert call.key is not None
    assert all(call.key not in repr(d) for _, d in events)
    assert all(d["key_id"] == events[0][1]["key_id"] for _, d in events)


def test_log_keys_adds_the_raw_key_and_give_up_is_an_event() -> None:
    events: list[tuple[str, dict[str, object]]] = []
    call = policy(max_attempts=1, log_keys=True, on_event=lambda e, d: events.append((e, d)))
    c = call.start("POST")
    c.attempt()
    c.on_error(Failure.LOST)
    assert events[-1][0] == "give_up"
    assert events[-1][1]["key"] == c.key
    assert events[-1][1]["reason"] == "max_attempts"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "https://user:pw@api.example:8443/v1/orders?token=s#frag",
            "https://api.example:8443/v1/orders",
        ),
        ("http://h/orders", "http://h/orders"),
        ("", ""),
    ],
)
def test_event_urls_drop_query_fragment_and_credentials(url: str, shown: str) -> None:
    events: list[dict[str, object]] = []
    call = policy(on_event=lambda e, d: events.append(d)).start("POST", url)
    call.attempt()
    assert events[0]["url"] == shown


def test_a_failing_hook_does_not_fail_the_call(caplog: pytest.LogCaptureFixture) -> None:
    def hook(event: str, details: dict[str, object]) -> None:
        raise RuntimeError("metrics down")

    call = policy(on_event=hook).start("POST")
    with caplog.at_level(logging.ERROR, logger="retrysafe.client"):
        call.attempt()
        assert call.on_response(201, {}).action == "return"
    assert "on_event hook failed" in caplog.text


# --- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"deadline": -1},
        {"backoff_initial": 2, "backoff_max": 1},
        {"retry_statuses": frozenset({99})},
        {"max_retry_after": -0.5},
    ],
)
def test_bad_settings_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_methods_are_case_insensitive() -> None:
    p = RetryPolicy(key_methods=frozenset({"put"}), idempotent_methods=frozenset({"get"}))
    assert p.start("PUT").key is not None
    assert p.start("POST").key is None
