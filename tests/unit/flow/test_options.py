"""Wire-contract options clients expect: replay header names, the retention header, and a
Retry-After that says when the first request is likely done."""

from __future__ import annotations

from email.utils import parsedate_to_datetime

import pytest

from retrysafe import ConfigurationError, IdempotencyConfig
from retrysafe._core.codec import StoredResponse, decode_response, encode_response
from retrysafe._core.http import Answer
from retrysafe._core.operation import COMPLETE, EXECUTE, NOW, RESERVE, Estimates

from .script import ANY, completed, flow_for, in_progress, run, won

STORED = encode_response(StoredResponse(201, ((b"content-type", b"application/json"),), b"{}"))


def _headers(answer: Answer) -> dict[bytes, bytes]:
    return dict(answer.headers)


def test_a_replay_says_idempotency_replayed_by_default() -> None:
    flow = flow_for()
    answer = run(flow.claim(), [(RESERVE, None, completed(flow, STORED))]).value
    assert _headers(answer)[b"idempotency-replayed"] == b"true"
    assert b"idempotent-replayed" not in _headers(answer)


def test_a_replay_also_says_stripes_idempotent_replayed_when_asked() -> None:
    flow = flow_for(replay_headers=("Idempotency-Replayed", "Idempotent-Replayed"))
    answer = run(flow.claim(), [(RESERVE, None, completed(flow, STORED))]).value
    assert _headers(answer)[b"idempotency-replayed"] == b"true"
    assert _headers(answer)[b"idempotent-replayed"] == b"true"


@pytest.mark.parametrize("bad", ["Idempotency Replayed", "", "x\n"])
def test_a_replay_header_that_is_no_header_name_is_refused_at_start_up(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="header name"):
        IdempotencyConfig(replay_headers=(bad,))


def test_a_bare_string_is_read_as_a_comma_separated_list_of_replay_headers() -> None:
    """As on every front (a variable, a flag): never the string's characters as names."""
    config = IdempotencyConfig(replay_headers="Idempotent-Replayed, X-Replayed")  # type: ignore[arg-type]
    assert config.replay_headers == ("Idempotent-Replayed", "X-Replayed")


def test_the_retention_header_is_added_to_the_first_response_and_stored_for_its_replay() -> None:
    flow = flow_for(retention_header="Idempotency-Key-Expires", ttl=3600)
    script = [(RESERVE, None, won()), (NOW, None, 1_800_000_000.0)]
    assert run(flow.claim(), script).value == EXECUTE
    ((name, value),) = flow.added_headers
    assert name == b"idempotency-key-expires"
    assert parsedate_to_datetime(value.decode()).timestamp() == 1_800_000_000 + 3600
    done = run(flow.settle_plain(201, [], b"{}", False), [(COMPLETE, ANY, True)])
    stored = decode_response(done.actions[0][1])
    assert (name, value) in stored.headers


def test_without_the_option_no_clock_is_read_and_nothing_is_added() -> None:
    flow = flow_for()
    assert run(flow.claim(), [(RESERVE, None, won())]).value == EXECUTE
    assert flow.added_headers == []


def _retry_after(answer: Answer) -> int:
    return int(_headers(answer)[b"retry-after"])


def test_retry_after_follows_how_long_the_route_takes_not_the_lease() -> None:
    flow = flow_for()
    flow.estimates = Estimates()
    flow.observe(1.4)
    answer = run(flow.claim(), [(RESERVE, None, in_progress(flow, 27.0))]).value
    assert _retry_after(answer) == 2


def test_retry_after_is_bounded_by_the_remaining_lease_and_at_least_one_second() -> None:
    flow = flow_for()
    flow.estimates = Estimates()
    flow.observe(20.0)
    assert _retry_after(run(flow.claim(), [(RESERVE, None, in_progress(flow, 4.2))]).value) == 5
    fast = flow_for()
    fast.estimates = Estimates()
    fast.observe(0.01)
    assert _retry_after(run(fast.claim(), [(RESERVE, None, in_progress(fast, 9.0))]).value) == 1


def test_retry_after_is_the_remaining_lease_without_an_estimate_or_when_turned_off() -> None:
    unknown = flow_for()
    unknown.estimates = Estimates()
    assert (
        _retry_after(run(unknown.claim(), [(RESERVE, None, in_progress(unknown, 27.0))]).value)
        == 27
    )
    off = flow_for(adaptive_retry_after=False)
    off.estimates = Estimates()
    off.observe(1.0)
    assert _retry_after(run(off.claim(), [(RESERVE, None, in_progress(off, 27.0))]).value) == 27


def test_the_estimate_is_a_running_average_per_method_and_path_and_bounded() -> None:
    estimates = Estimates(limit=2)
    estimates.observe(("POST", "/a"), 1.0)
    estimates.observe(("POST", "/a"), 2.0)
    assert estimates.get(("POST", "/a")) == pytest.approx(1.2)
    assert estimates.get(("PATCH", "/a")) is None
    estimates.observe(("POST", "/b"), 1.0)
    estimates.observe(("POST", "/c"), 5.0)  # over the limit: starts over
    assert estimates.get(("POST", "/a")) is None
    assert estimates.get(("POST", "/c")) == 5.0
