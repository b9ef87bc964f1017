"""The RPC layer, phase by phase (scripted like the HTTP flow): admission of the metadata, the
claim's answers (replay with the stored trailing metadata, ABORTED with pushback, reused key),
the status policy at settlement, a failing handler. No server, no store, no gRPC."""

from __future__ import annotations

import pytest

from retrysafe import IdempotencyConfig, StoreError
from retrysafe._core.operation import COMPLETE, EMIT, EXECUTE, RELEASE, RESERVE
from retrysafe._core.rpc import (
    CODES,
    DEFAULT_RELEASE_CODES,
    REPLAYED,
    RpcAnswer,
    RpcFlow,
    admit_rpc,
    metadata_principal,
)
from retrysafe.stores import Record, Reservation

from .script import ANY, run


def _flow(request: bytes = b'{"item": "tea"}', method: str = "/shop.Orders/Create") -> RpcFlow:
    return RpcFlow(IdempotencyConfig(), method, "k-1", request, "")


def _stored(
    flow: RpcFlow, code: str, response: bytes | None, trailing: list[tuple[str, str]]
) -> bytes:
    data = flow.stored(code, f"ended with {code}" if code != "OK" else "", response, trailing)
    assert data is not None
    return data


def test_no_key_passes_unless_required() -> None:
    assert admit_rpc((), unary=True, required=False) is None
    missing = admit_rpc((("other", "x"),), unary=True, required=True)
    assert isinstance(missing, RpcAnswer) and missing.code == "INVALID_ARGUMENT"
    assert missing.event == "missing_key"


@pytest.mark.parametrize(
    "value", ["", "a b", "k" * 256, "caf\u00e9"], ids=["empty", "space", "long", "non-ascii"]
)
def test_a_malformed_key_is_invalid_argument(value: str) -> None:
    answer = admit_rpc((("idempotency-key", value),), unary=True, required=False)
    assert isinstance(answer, RpcAnswer) and answer.code == "INVALID_ARGUMENT"
    assert answer.details.startswith("Invalid idempotency-key metadata: ")


def test_two_key_entries_are_invalid_and_one_is_the_key() -> None:
    two = admit_rpc(
        (("idempotency-key", "a"), ("idempotency-key", "a")), unary=True, required=False
    )
    assert isinstance(two, RpcAnswer) and two.code == "INVALID_ARGUMENT"
    assert admit_rpc((("idempotency-key", '"k-1"'),), unary=True, required=False) == "k-1"


def test_a_key_on_a_streaming_method_is_refused() -> None:
    answer = admit_rpc((("idempotency-key", "k"),), unary=False, required=False)
    assert isinstance(answer, RpcAnswer) and answer.code == "INVALID_ARGUMENT"
    assert "unary-unary methods only" in answer.details
    assert admit_rpc((), unary=False, required=False) is None


def test_the_key_names_one_record_whatever_the_method_and_the_fingerprint_tells_them_apart() -> (
    None
):
    create, other = _flow(), _flow(method="/shop.Orders/Cancel")
    assert create.record_id == other.record_id
    assert create.fingerprint != other.fingerprint
    assert create.fingerprint != _flow(b'{"item": "pen"}').fingerprint


def test_the_principal_scopes_the_record() -> None:
    principal = metadata_principal("authorization")
    alice = principal((("authorization", "Bearer alice"),))
    assert alice and alice != principal((("authorization", "Bearer bob"),))
    assert principal(()) == ""
    config = IdempotencyConfig()
    assert (
        RpcFlow(config, "/s/M", "k", b"", alice).record_id
        != RpcFlow(config, "/s/M", "k", b"", "").record_id
    )


def test_a_first_call_executes() -> None:
    flow = _flow()
    assert run(flow.claim(), [(RESERVE, None, Reservation(token="t"))]).value == EXECUTE


def test_a_completed_record_replays_code_details_response_and_trailing_marked() -> None:
    flow = _flow()
    data = _stored(flow, "OK", b"response bytes", [("order-id", "7")])
    reservation = Reservation(record=Record(flow.fingerprint, "completed", data))
    answer = run(flow.claim(), [(RESERVE, None, reservation)]).value
    assert (answer.code, answer.details, answer.response) == ("OK", "", b"response bytes")
    assert answer.trailing == [("order-id", "7"), (REPLAYED, "true")]


def test_a_stored_error_code_replays_without_a_response() -> None:
    flow = _flow()
    data = _stored(flow, "NOT_FOUND", None, [])
    reservation = Reservation(record=Record(flow.fingerprint, "completed", data))
    answer = run(flow.claim(), [(RESERVE, None, reservation)]).value
    assert (answer.code, answer.details, answer.response) == (
        "NOT_FOUND",
        "ended with NOT_FOUND",
        None,
    )


def test_a_running_first_call_is_aborted_with_a_retry_delay_and_pushback() -> None:
    flow = _flow()
    record = Record(flow.fingerprint, "in_progress", lease_remaining=2.2)
    answer = run(flow.claim(), [(RESERVE, None, Reservation(record=record))]).value
    assert answer.code == "ABORTED"
    assert dict(answer.trailing) == {"retry-after": "3", "grpc-retry-pushback-ms": "3000"}


def test_another_request_with_the_key_is_invalid_argument() -> None:
    flow = _flow()
    record = Record("0" * 64, "completed", b"")
    answer = run(flow.claim(), [(RESERVE, None, Reservation(record=record)), (EMIT, "mismatch")])
    assert answer.value.code == "INVALID_ARGUMENT" and "different request" in answer.value.details


def test_a_store_failure_at_the_claim_is_unavailable() -> None:
    flow = _flow()
    script = [(RESERVE, None, StoreError("down")), (EMIT, "store_error")]
    answer = run(flow.claim(), script).value
    assert answer.code == "UNAVAILABLE" and dict(answer.trailing)["retry-after"] == "1"


@pytest.mark.parametrize("code", sorted(set(CODES) - DEFAULT_RELEASE_CODES))
def test_outcomes_of_executed_work_are_stored(code: str) -> None:
    flow = _flow()
    flow.token = "t"
    assert run(flow.settle(code, "", b"r", []), [(COMPLETE, ANY, True)]).value is None


@pytest.mark.parametrize("code", sorted(DEFAULT_RELEASE_CODES))
def test_failures_and_rejections_free_the_key(code: str) -> None:
    flow = _flow()
    flow.token = "t"
    assert run(flow.settle(code, "", None, []), [(RELEASE, None, True)]).value is None


def test_a_handler_exception_frees_the_key_and_passes() -> None:
    flow = _flow()
    flow.token = "t"
    assert run(flow.failed(RuntimeError("boom")), [(RELEASE, None, True)]).value is None
