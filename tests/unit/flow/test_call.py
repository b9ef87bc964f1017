"""The call layer, phase by phase (scripted like the HTTP flow): a call's claim, its settlement
with a result or an exception, the transactional commit, and how keys, fingerprints and results
are made from a function's arguments. No store, no event loop."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import uuid
from typing import Any

import pytest

from retrysafe import (
    CodecError,
    ConfigurationError,
    IdempotencyConfig,
    InProgressError,
    InvalidKeyError,
    KeyReusedError,
    OutcomeUnknownError,
    StoreError,
    StoreUnavailableError,
)
from retrysafe._core.call import (
    REPLAYED,
    Call,
    CallSpec,
    call_fingerprint,
    from_json,
    to_json,
)
from retrysafe._core.operation import (
    BEGIN,
    CLOCK,
    COMPLETE,
    DEFER,
    EMIT,
    EXECUTE,
    FINALIZE,
    MARK_COMMITTED,
    RELEASE,
    RESERVE,
    RUN_UNPROTECTED,
    SLEEP,
    TX_CLOSE,
    TX_COMPLETE,
    TX_ROLLBACK,
    TX_STATE,
)
from retrysafe.calls import call_config
from retrysafe.stores import Record, Reservation

from .script import ANY, Events, run, won


class Declined(Exception):
    pass


@dataclasses.dataclass
class Receipt:
    order_id: str
    amount: decimal.Decimal


def charge(order_id: str, amount: int, note: str = "") -> Receipt:
    return Receipt(order_id, decimal.Decimal(amount))


SPEC = CallSpec(charge, key="order_id", final=[Declined])


def call_for(*, events: bool = False, spec: CallSpec = SPEC, **options: Any) -> Call:
    config = IdempotencyConfig(on_event=Events() if events else None, **options)
    key, fingerprint, _ = spec.prepare(("o-1", 5), {})
    return Call(config, spec, key, fingerprint)


def claimed(**options: Any) -> Call:
    call = call_for(**options)
    script: list[tuple[object, ...]] = [(RESERVE, None, won())]
    if call.config.transactional:
        script.append((BEGIN, None))
    if call.config.on_event is not None:
        script.append((EMIT, "executed"))
    assert run(call.claim(), script).value == EXECUTE
    return call


def completed(call: Call, data: bytes) -> Reservation:
    return Reservation(record=Record(call.fingerprint, "completed", data))


def running(call: Call, lease: float = 7.2, *, committed: bool = False) -> Reservation:
    record = Record(call.fingerprint, "in_progress", lease_remaining=lease, committed=committed)
    return Reservation(record=record)


RESULT = Receipt("o-1", decimal.Decimal(5))


# -- claim ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("events", [False, True], ids=["no-hook", "hook"])
def test_a_won_key_executes_without_any_http_step(events: bool) -> None:
    call = claimed(events=events)
    assert call.token == "tok-1"


def test_a_completed_record_returns_the_stored_result_typed_by_the_annotation() -> None:
    call = call_for(events=True)
    data = SPEC.encode_result(RESULT)
    script = [(RESERVE, None, completed(call, data)), (EMIT, "replayed")]
    assert run(call.claim(), script).value == REPLAYED
    assert call.value == RESULT and isinstance(call.value.amount, decimal.Decimal)


def test_a_stored_final_exception_is_raised_again() -> None:
    call = call_for()
    data = SPEC.encode_failure(Declined("card declined"), Declined)
    with pytest.raises(Declined, match="card declined"):
        run(call.claim(), [(RESERVE, None, completed(call, data))])


def test_a_result_stored_by_another_codec_is_never_decoded_by_this_one() -> None:
    pickled = CallSpec(charge, key="order_id", codec="pickle").encode_result(RESULT)
    call = call_for(events=True)
    script = [(RESERVE, None, completed(call, pickled)), (EMIT, "replayed"), (EMIT, "store_error")]
    with pytest.raises(CodecError, match="stored by the pickle codec"):
        run(call.claim(), script)


def test_a_record_that_is_not_a_call_result_is_a_codec_error() -> None:
    call = call_for()
    with pytest.raises(CodecError, match="not a call result"):
        run(call.claim(), [(RESERVE, None, completed(call, b"RS\x02junk")), (EMIT, "store_error")])


@pytest.mark.parametrize("state", ["completed", "in_progress"])
def test_other_arguments_raise_key_reused_even_while_the_first_runs(state: str) -> None:
    call = call_for(events=True)
    other = Record("0" * 64, state, b"x" if state == "completed" else None, 3.0)  # type: ignore[arg-type]
    with pytest.raises(KeyReusedError) as caught:
        run(call.claim(), [(RESERVE, None, Reservation(record=other)), (EMIT, "mismatch")])
    assert caught.value.function == "charge" and caught.value.record == call.record_id[:16]


def test_committed_effects_of_a_dead_call_are_outcome_unknown() -> None:
    call = call_for(events=True)
    script = [(RESERVE, None, running(call, 0.0, committed=True)), (EMIT, "outcome_unknown")]
    with pytest.raises(OutcomeUnknownError):
        run(call.claim(), script)


def test_a_running_first_call_raises_in_progress_with_the_remaining_lease() -> None:
    call = call_for(events=True, adaptive_retry_after=False)
    with pytest.raises(InProgressError) as caught:
        run(call.claim(), [(RESERVE, None, running(call, 7.2)), (EMIT, "conflict")])
    assert caught.value.retry_after == 8


def test_waiting_polls_until_the_first_call_completes() -> None:
    call = call_for(on_conflict="wait", conflict_wait=5.0)
    data = SPEC.encode_result(RESULT)
    script = [
        (RESERVE, None, running(call)),
        (CLOCK, None, 100.0),
        (SLEEP, 0.01),
        (RESERVE, None, completed(call, data)),
    ]
    assert run(call.claim(), script).value == REPLAYED
    assert call.value == RESULT


def test_a_store_error_at_the_claim_is_raised_as_it_is_fail_closed() -> None:
    call = call_for(events=True)
    error = StoreUnavailableError("refused", store="redis")
    with pytest.raises(StoreUnavailableError) as caught:
        run(call.claim(), [(RESERVE, None, error), (EMIT, "store_error")])
    assert caught.value is error


def test_a_store_error_at_the_claim_runs_unprotected_fail_open() -> None:
    call = call_for(on_store_error="fail_open")
    script = [(RESERVE, None, StoreError("down")), (EMIT, "fail_open")]
    assert run(call.claim(), script).value == RUN_UNPROTECTED


# -- settlement ----------------------------------------------------------------------------------


def test_a_result_is_stored_fenced() -> None:
    call = claimed()
    script = [(COMPLETE, SPEC.encode_result(RESULT), True)]
    run(call.settle(RESULT), script)


def test_a_refused_completion_is_deferred_with_the_same_bytes() -> None:
    call = claimed()
    data = SPEC.encode_result(RESULT)
    script = [(COMPLETE, data, StoreError("down")), (EMIT, "completion_deferred"), (DEFER, data)]
    run(call.settle(RESULT), script)


def test_a_fenced_out_completion_reports_the_lost_lease() -> None:
    call = claimed()
    run(call.settle(RESULT), [(COMPLETE, ANY, False), (EMIT, "lease_lost")])
    assert call.lease_lost


@pytest.mark.parametrize("committed", [False, True], ids=["plain", "committed"])
def test_a_result_the_codec_cannot_encode_is_outcome_unknown_never_a_rerun(committed: bool) -> None:
    """The function returned: its effect happened, so the key is never freed."""
    call = claimed()
    call.committed = committed
    with pytest.raises(CodecError, match="codec='pickle'"):
        run(call.settle(object()), [(EMIT, "outcome_unknown"), (MARK_COMMITTED, 0.0)])


def test_a_result_the_codec_cannot_encode_in_a_transaction_rolls_back_and_frees_the_key() -> None:
    """In transactional mode the run's writes roll back with the record: nothing remains."""
    call = claimed(transactional=True)
    with pytest.raises(CodecError):
        run(
            call.settle(object()),
            [(FINALIZE, False), (TX_ROLLBACK, None), (TX_CLOSE, None), (RELEASE, None)],
        )


def test_a_plain_exception_frees_the_key() -> None:
    call = claimed()
    run(call.failed(ConnectionError("timeout")), [(RELEASE, None, True)])


def test_an_exception_after_committed_effects_declares_the_outcome_unknown() -> None:
    call = claimed()
    call.committed = True
    run(call.failed(ConnectionError("lost")), [(EMIT, "outcome_unknown"), (MARK_COMMITTED, 0.0)])


def test_a_final_exception_is_stored_as_the_outcome() -> None:
    call = claimed()
    error = Declined("no funds")
    run(call.failed(error), [(COMPLETE, SPEC.encode_failure(error, Declined), True)])


def test_a_final_exception_in_a_transaction_rolls_back_then_stores_the_outcome() -> None:
    call = claimed(transactional=True)
    error = Declined("no funds")
    script = [
        (FINALIZE, False),
        (TX_ROLLBACK, None),
        (TX_CLOSE, None),
        (COMPLETE, SPEC.encode_failure(error, Declined), True),
    ]
    run(call.failed(error), script)
    assert not call.in_tx


def test_a_result_commits_with_the_functions_writes() -> None:
    call = claimed(transactional=True)
    script = [
        (FINALIZE, True),
        (TX_STATE, None, (True, False)),
        (TX_COMPLETE, SPEC.encode_result(RESULT), True),
        (TX_CLOSE, None),
    ]
    run(call.settle(RESULT), script)


def test_a_commit_that_fails_frees_the_key_and_raises_the_store_error() -> None:
    call = claimed(transactional=True)
    error = StoreUnavailableError("connection lost")
    script = [
        (FINALIZE, True),
        (TX_STATE, None, (True, False)),
        (TX_COMPLETE, ANY, error),
        (TX_CLOSE, None),
        (RELEASE, None, True),
        (EMIT, "store_error"),
    ]
    with pytest.raises(StoreUnavailableError) as caught:
        run(call.settle(RESULT), script)
    assert caught.value is error


def test_a_fenced_out_commit_raises_in_progress_its_writes_rolled_back() -> None:
    call = claimed(transactional=True, lease=12.0)
    script = [
        (FINALIZE, True),
        (TX_STATE, None, (True, False)),
        (TX_COMPLETE, ANY, False),
        (TX_CLOSE, None),
        (EMIT, "lease_lost"),
    ]
    with pytest.raises(InProgressError, match="rolled back") as caught:
        run(call.settle(RESULT), script)
    assert caught.value.retry_after == 12


def test_events_carry_the_kind_and_the_function_never_the_key() -> None:
    call = claimed(events=True)
    call.notify("executed")
    hook = call.config.on_event
    assert isinstance(hook, Events)
    assert hook.calls == [
        ("executed", {"record": call.record_id[:16], "kind": "call", "function": "charge"})
    ]


# -- keys and fingerprints -------------------------------------------------------------------------


def test_the_fingerprint_is_the_bound_arguments_however_they_were_passed() -> None:
    a = SPEC.prepare(("o-1", 5), {})
    b = SPEC.prepare((), {"amount": 5, "order_id": "o-1", "note": ""})
    c = SPEC.prepare(("o-1", 6), {})
    assert a[:2] == b[:2]
    assert a[0] == c[0] and a[1] != c[1]


def test_the_fingerprint_of_a_dict_does_not_depend_on_its_order() -> None:
    assert call_fingerprint("f", {"x": {"a": 1, "b": 2}}) == call_fingerprint(
        "f", {"x": {"b": 2, "a": 1}}
    )
    assert call_fingerprint("f", {"x": 1}) != call_fingerprint("g", {"x": 1})


def test_keys_from_a_callable_names_or_the_call() -> None:
    by_callable = CallSpec(charge, key=lambda order_id, amount, note="": f"c-{order_id}")
    by_names = CallSpec(charge, key=("order_id", "amount"))
    at_call = CallSpec(charge)
    assert by_callable.prepare(("o-1", 5), {})[0] == "c-o-1"
    assert by_names.prepare(("o-1", 5), {})[0] == '["o-1",5]'
    key, _, kwargs = at_call.prepare(("o-1", 5), {"idempotency_key": "k-1"})
    assert key == "k-1" and kwargs == {}
    with pytest.raises(InvalidKeyError, match="no idempotency key"):
        at_call.prepare(("o-1", 5), {})
    with pytest.raises(InvalidKeyError, match="must be a str or int"):
        CallSpec(charge, key=lambda *a: None).prepare(("o-1", 5), {})
    with pytest.raises(InvalidKeyError, match="empty"):
        at_call.prepare(("o-1", 5), {"idempotency_key": ""})


def test_a_function_that_takes_the_key_itself_receives_it() -> None:
    def send(message: str, idempotency_key: str) -> None:
        return None

    spec = CallSpec(send)
    key, fingerprint, kwargs = spec.prepare(("hi",), {"idempotency_key": "k-1"})
    assert key == "k-1" and kwargs == {"idempotency_key": "k-1"}
    # The key is not part of the fingerprint: the fingerprint says what the call does.
    assert fingerprint == call_fingerprint(spec.name, {"message": "hi"})


def test_call_options_name_what_does_not_apply() -> None:
    with pytest.raises(ConfigurationError, match="'required' is an HTTP option"):
        call_config(None, {"required": True}, where="x")
    assert call_config(None, {"lease": 4.0}, where="x").lease == 4.0


# -- JSON with Python's types ----------------------------------------------------------------------


class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Everything:
    when: datetime.datetime
    day: datetime.date
    id: uuid.UUID
    price: decimal.Decimal
    colour: Colour
    raw: bytes
    pair: tuple[int, str]
    tags: frozenset[str]
    counts: dict[int, float]
    maybe: Receipt | None
    many: list[Receipt]


def test_json_round_trips_the_types_a_result_is_made_of() -> None:
    value = Everything(
        when=datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
        day=datetime.date(2026, 1, 2),
        id=uuid.UUID(int=7),
        price=decimal.Decimal("9.99"),
        colour=Colour.RED,
        raw=b"\x00\xff",
        pair=(1, "a"),
        tags=frozenset({"b", "a"}),
        counts={1: 0.5},
        maybe=Receipt("o", decimal.Decimal(1)),
        many=[Receipt("p", decimal.Decimal(2))],
    )
    import json

    assert from_json(Everything, json.loads(json.dumps(to_json(value)))) == value


def test_json_names_a_type_it_cannot_hold() -> None:
    with pytest.raises(TypeError, match="object is not JSON"):
        to_json({"a": [object()]})
