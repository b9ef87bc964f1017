"""The gRPC interceptors (sync ``grpc.server`` and ``grpc.aio.server``) on real servers over
loopback: one call sent twice runs once and replays the same bytes, marked; concurrent calls
with one key run once; a reused key, a missing or malformed key, failures and status codes,
streaming methods with a key."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from retrysafe import ConfigurationError
from retrysafe.contrib.grpc import IdempotencyInterceptor

from .harness import Server, call, upload, watch
from .service import CREATE

KINDS = [pytest.param("sync", id="sync"), pytest.param("aio", id="aio")]


@pytest.fixture(params=KINDS)
def make_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Server]]:
    made: list[Server] = []

    def make(**options: Any) -> Server:
        store = options.pop("store", f"sqlite:///{tmp_path}/idempotency.db")
        server = Server(request.param, store, tmp_path / "effects.db", **options)
        made.append(server)
        return server

    yield make
    for server in made:
        server.close()


def test_one_call_sent_twice_runs_once_and_the_repeat_gets_the_same_bytes_marked(
    make_server: Callable[..., Server],
) -> None:
    server = make_server()
    first = call(server.channel, {"item": "book"}, key="k1")
    again = call(server.channel, {"item": "book"}, key="k1")
    assert first.code is grpc.StatusCode.OK and again.code is grpc.StatusCode.OK
    assert first.body == b'{"item": "book", "order": 1}'
    assert again.body == first.body
    assert not first.replayed and again.replayed
    assert again.trailing["order-id"] == "1"  # the handler's trailing metadata, stored
    assert server.effects.count() == 1


def test_calls_without_a_key_run_every_time(make_server: Callable[..., Server]) -> None:
    server = make_server()
    outcomes = [call(server.channel, {"item": "book"}) for _ in range(2)]
    assert [o.code for o in outcomes] == [grpc.StatusCode.OK] * 2
    assert not any(o.replayed for o in outcomes)
    assert server.effects.count() == 2


def test_eight_concurrent_calls_with_one_key_run_once(make_server: Callable[..., Server]) -> None:
    server = make_server()
    outcomes: list[Any] = []
    start = threading.Barrier(8)

    def send() -> None:
        start.wait()
        outcomes.append(call(server.channel, {"item": "book", "hold": 0.5}, key="same"))

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert server.effects.count() == 1
    ok = [o for o in outcomes if o.code is grpc.StatusCode.OK]
    busy = [o for o in outcomes if o.code is grpc.StatusCode.ABORTED]
    assert len(ok) >= 1 and len(ok) + len(busy) == 8
    assert len({o.body for o in ok}) == 1
    for refused in busy:
        assert int(refused.trailing["retry-after"]) >= 1
        assert int(refused.trailing["grpc-retry-pushback-ms"]) >= 1000
        assert "still running" in refused.details
    assert call(server.channel, {"item": "book", "hold": 0.5}, key="same").replayed


def test_waiting_calls_get_the_first_outcome_with_on_conflict_wait(
    make_server: Callable[..., Server],
) -> None:
    server = make_server(on_conflict="wait")
    outcomes: list[Any] = []

    def send() -> None:
        outcomes.append(call(server.channel, {"item": "pen", "hold": 0.4}, key="w"))

    threads = [threading.Thread(target=send) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert [o.code for o in outcomes] == [grpc.StatusCode.OK] * 4
    assert len({o.body for o in outcomes}) == 1
    assert sum(o.replayed for o in outcomes) == 3
    assert server.effects.count() == 1


def test_a_key_reused_with_another_request_or_method_is_invalid_argument(
    make_server: Callable[..., Server],
) -> None:
    server = make_server()
    assert call(server.channel, {"item": "book"}, key="k").code is grpc.StatusCode.OK
    other = call(server.channel, {"item": "lamp"}, key="k")
    assert other.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "different request" in other.details
    elsewhere = call(server.channel, {"item": "book"}, key="k", method="/shop.Orders/Missing")
    assert elsewhere.code is grpc.StatusCode.UNIMPLEMENTED  # no such method: nothing to guard
    assert server.effects.count() == 1


def test_keys_are_scoped_by_the_authorization_metadata(make_server: Callable[..., Server]) -> None:
    server = make_server()
    alice = (("authorization", "Bearer alice"),)
    bob = (("authorization", "Bearer bob"),)
    a = call(server.channel, {"item": "book"}, key="k", metadata=alice)
    b = call(server.channel, {"item": "book"}, key="k", metadata=bob)
    assert a.code is b.code is grpc.StatusCode.OK
    assert not b.replayed and a.body != b.body  # bob never gets alice's outcome
    assert call(server.channel, {"item": "book"}, key="k", metadata=alice).body == a.body
    assert server.effects.count() == 2


def test_a_missing_key_on_a_required_method_and_a_malformed_key_run_nothing(
    make_server: Callable[..., Server],
) -> None:
    server = make_server(required_methods=[CREATE])
    missing = call(server.channel, {"item": "book"})
    assert missing.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "requires idempotency-key" in missing.details
    malformed = call(server.channel, {"item": "book"}, key="a b")
    assert malformed.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "Invalid idempotency-key" in malformed.details
    assert server.effects.count() == 0


def test_a_handler_exception_frees_the_key_and_the_retry_runs(
    make_server: Callable[..., Server],
) -> None:
    server = make_server()
    failed = call(server.channel, {"item": "book", "fail": True}, key="f")
    assert failed.code is grpc.StatusCode.UNKNOWN
    assert server.effects.count() == 0
    retried = call(server.channel, {"item": "book", "fail": True}, key="f")
    assert retried.code is grpc.StatusCode.UNKNOWN and not retried.replayed


@pytest.mark.parametrize(
    ("code", "stored"),
    [
        ("NOT_FOUND", True),
        ("ALREADY_EXISTS", True),
        ("FAILED_PRECONDITION", True),
        ("INTERNAL", False),
        ("UNAVAILABLE", False),
        ("DEADLINE_EXCEEDED", False),
        ("INVALID_ARGUMENT", False),
        ("RESOURCE_EXHAUSTED", False),
    ],
)
def test_outcomes_of_executed_work_are_stored_and_failures_free_the_key(
    make_server: Callable[..., Server], code: str, stored: bool
) -> None:
    server = make_server()
    first = call(server.channel, {"item": "book", "abort": code}, key="c")
    second = call(server.channel, {"item": "book", "abort": code}, key="c")
    assert first.code.name == second.code.name == code
    assert second.details == first.details == f"ended with {code}"
    assert second.replayed is stored
    assert server.effects.count() == (1 if stored else 2)
    if stored:
        assert second.trailing["order-id"] == first.trailing["order-id"]


def test_release_codes_are_configurable(make_server: Callable[..., Server]) -> None:
    server = make_server(release_codes=["NOT_FOUND"])
    call(server.channel, {"item": "book", "abort": "NOT_FOUND"}, key="r")
    again = call(server.channel, {"item": "book", "abort": "NOT_FOUND"}, key="r")
    assert not again.replayed and server.effects.count() == 2


def test_a_key_on_a_streaming_method_is_refused_and_without_one_it_runs(
    make_server: Callable[..., Server],
) -> None:
    server = make_server()
    assert watch(server.channel, key="s") == (grpc.StatusCode.INVALID_ARGUMENT, 0)
    assert watch(server.channel) == (grpc.StatusCode.OK, 2)
    assert upload(server.channel, key="s") is grpc.StatusCode.INVALID_ARGUMENT
    assert upload(server.channel) is grpc.StatusCode.OK


def test_methods_limits_what_is_protected(make_server: Callable[..., Server]) -> None:
    server = make_server(methods=["/shop.Orders/Other"])
    call(server.channel, {"item": "book"}, key="m")
    again = call(server.channel, {"item": "book"}, key="m")
    assert not again.replayed and server.effects.count() == 2


def test_an_unreachable_store_is_unavailable_with_a_retry_delay(
    make_server: Callable[..., Server],
) -> None:
    server = make_server(store="redis://127.0.0.1:9/0?timeout=0.5&connect_timeout=0.5")
    refused = call(server.channel, {"item": "book"}, key="u")
    assert refused.code is grpc.StatusCode.UNAVAILABLE
    assert refused.trailing["retry-after"] == "1"
    assert server.effects.count() == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tll": 5}, "IdempotencyInterceptor(tll=...): unknown option (did you mean ttl?)"),
        ({"ttl": -5}, "IdempotencyInterceptor(ttl=...): must be positive, got -5"),
        ({"methods": ["Create"]}, "IdempotencyInterceptor(methods=...): full method names"),
        ({"release_codes": ["NOPE"]}, "IdempotencyInterceptor(release_codes=...): not status"),
        (
            {"release_statuses": [404]},
            "IdempotencyInterceptor(release_statuses=...): an HTTP option, it does not apply to "
            "gRPC calls (use release_codes=)",
        ),
    ],
)
def test_a_bad_option_is_one_configuration_error_at_construction(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        IdempotencyInterceptor(store="memory://", **options)
    assert str(refused.value).startswith(message)


def test_events_name_the_method_as_the_route_for_metrics(
    make_server: Callable[..., Server],
) -> None:
    events: list[tuple[str, Any]] = []
    server = make_server(on_event=lambda event, details: events.append((event, details)))
    call(server.channel, {"item": "book"}, key="e")
    call(server.channel, {"item": "book"}, key="e")
    seen = {(event, details["route"]) for event, details in events}
    assert {("executed", CREATE), ("replayed", CREATE)} <= seen
