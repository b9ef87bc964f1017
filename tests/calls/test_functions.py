"""``idempotent_function`` on every store, ``def`` and ``async def``: one run per key, the
stored result for every duplicate, keys, fingerprints, codecs, exceptions, conflicts."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import threading
import uuid
from typing import Any

import pydantic
import pytest

import retrysafe
from retrysafe import (
    ArgumentError,
    CodecError,
    ConfigurationError,
    InProgressError,
    InvalidKeyError,
    KeyReusedError,
    OutcomeUnknownError,
    idempotent_function,
)
from retrysafe import functions as sync_functions
from retrysafe.stores import MemoryStore

from .conftest import StoreURL
from .faces import FACES, Face


@pytest.fixture(params=FACES)
def face(request: pytest.FixtureRequest) -> Face:
    return Face(request.param)


@dataclasses.dataclass(frozen=True)
class Line:
    sku: str
    quantity: int


@dataclasses.dataclass(frozen=True)
class Receipt:
    order_id: str
    amount: int
    lines: tuple[Line, ...]
    charged_at: datetime.datetime


class Payment(pydantic.BaseModel):
    id: uuid.UUID
    amount: int
    tags: list[str]


class Declined(Exception):
    """A final outcome: the card was declined (retrying with the same key will not change it)."""


# -- one run per key ---------------------------------------------------------------------------


async def test_a_duplicate_gets_the_stored_result_without_running(
    store: StoreURL, face: Face
) -> None:
    runs: list[str] = []

    def charge(order_id: str, amount: int) -> dict[str, Any]:
        runs.append(order_id)
        return {"order": order_id, "amount": amount, "run": len(runs)}

    fn = face.define(charge, store=store.url, key=lambda order_id, amount: f"charge-{order_id}")
    try:
        first = await face.call(fn, "o-1", 250)
        again = await face.call(fn, "o-1", 250)
        other = await face.call(fn, "o-2", 250)
    finally:
        await face.close(fn)
    assert first == again == {"order": "o-1", "amount": 250, "run": 1}
    assert other["run"] == 2
    assert runs == ["o-1", "o-2"]


async def test_dataclasses_and_pydantic_models_round_trip(store: StoreURL, face: Face) -> None:
    at = datetime.datetime(2026, 3, 1, 12, 30, tzinfo=datetime.UTC)
    receipt = Receipt("o-7", 990, (Line("tea", 2), Line("cup", 1)), at)
    payment = Payment(id=uuid.uuid4(), amount=5, tags=["a", "b"])

    def make_receipt(order_id: str) -> Receipt:
        return receipt

    def make_payment(order_id: str) -> Payment:
        return payment

    fr = face.define(make_receipt, store=store.url, key="order_id")
    fp = face.define(make_payment, store=store.url, key="order_id")
    try:
        assert await face.call(fr, "o-7") == receipt
        replayed = await face.call(fr, "o-7")
        assert await face.call(fp, "o-7") == payment
        replayed_payment = await face.call(fp, "o-7")
    finally:
        await face.close(fr)
        await face.close(fp)
    assert replayed == receipt and isinstance(replayed.lines[0], Line)
    assert replayed.charged_at == at
    assert isinstance(replayed_payment, Payment) and replayed_payment == payment


async def test_pickle_stores_what_json_cannot_when_asked(store: StoreURL, face: Face) -> None:
    def make(n: int) -> Any:
        return {frozenset({1, 2}): complex(n, 1)}

    fn = face.define(make, store=store.url, key="n", codec="pickle")
    try:
        assert await face.call(fn, 3) == await face.call(fn, 3) == {frozenset({1, 2}): 3 + 1j}
    finally:
        await face.close(fn)


async def test_a_result_json_cannot_hold_keeps_the_key_as_outcome_unknown(
    store: StoreURL, face: Face
) -> None:
    """The function ran, so its effect happened: the key is never freed for a second run; the
    caller gets a CodecError saying what to do, every duplicate "outcome unknown"."""
    runs: list[int] = []

    def make(n: int) -> Any:
        runs.append(n)
        return object()

    fn = face.define(make, store=store.url, key="n")
    try:
        with pytest.raises(CodecError, match="codec='pickle'"):
            await face.call(fn, 1)
        with pytest.raises(OutcomeUnknownError):
            await face.call(fn, 1)
    finally:
        await face.close(fn)
    assert runs == [1]


# -- keys --------------------------------------------------------------------------------------


async def test_keys_from_named_arguments_and_at_call_time(store: StoreURL, face: Face) -> None:
    runs: list[tuple[str, str]] = []

    def ship(order_id: str, carrier: str, note: str = "") -> int:
        runs.append((order_id, carrier))
        return len(runs)

    by_names = face.define(ship, store=store.url, key=("order_id", "carrier"), name="ship")
    at_call = face.define(ship, store=store.url, name="ship-2")
    try:
        assert await face.call(by_names, "o-1", "ups") == 1
        assert await face.call(by_names, "o-1", "ups") == 1
        assert await face.call(by_names, "o-1", "dhl") == 2  # another key
        assert await face.call(at_call, "o-1", "ups", idempotency_key="k-1") == 3
        assert await face.call(at_call, "o-1", "ups", idempotency_key="k-1") == 3
        # A key given at call time wins over the configured one.
        assert await face.call(by_names, "o-1", "ups", idempotency_key="k-9") == 4
        with pytest.raises(InvalidKeyError, match="no idempotency key"):
            await face.call(at_call, "o-1", "ups")
        with pytest.raises(InvalidKeyError, match="longer than 255"):
            await face.call(at_call, "o-1", "ups", idempotency_key="x" * 256)
    finally:
        await face.close(by_names)
        await face.close(at_call)


async def test_with_key_passes_the_key_for_type_checkers(store: StoreURL, face: Face) -> None:
    def double(n: int) -> int:
        return n * 2

    fn = face.define(double, store=store.url)
    try:
        assert await face.call(fn.with_key("k"), 2) == 4
        with pytest.raises(KeyReusedError):
            await face.call(fn.with_key("k"), 3)
    finally:
        await face.close(fn)


async def test_keys_are_scoped_by_the_function_unless_named_alike(
    store: StoreURL, face: Face
) -> None:
    def first(n: int) -> str:
        return "first"

    def second(n: int) -> str:
        return "second"

    # One memory store for the three (each memory:// URL is a store of its own).
    where: Any = MemoryStore() if store.id == "memory" else store.url
    f1 = face.define(first, store=where, key="n")
    f2 = face.define(second, store=where, key="n")
    f3 = face.define(second, store=where, key="n", name=f1.name)
    try:
        assert await face.call(f1, 1) == "first"
        assert await face.call(f2, 1) == "second"
        assert await face.call(f3, 1) == "first"  # shares first's keys
    finally:
        for fn in (f1, f2, f3):
            await face.close(fn)
    assert f1.name.endswith("first") and f1.record_id("1") != f2.record_id("1")


# -- fingerprints ------------------------------------------------------------------------------


async def test_the_fingerprint_covers_only_the_chosen_arguments(
    store: StoreURL, face: Face
) -> None:
    def charge(order_id: str, amount: int, trace_id: str) -> int:
        return amount

    fn = face.define(charge, store=store.url, key="order_id", fingerprint=["order_id", "amount"])
    try:
        assert await face.call(fn, "o-1", 5, "trace-a") == 5
        assert await face.call(fn, "o-1", 5, "trace-b") == 5  # not part of the fingerprint
        with pytest.raises(KeyReusedError):
            await face.call(fn, "o-1", 7, "trace-a")
    finally:
        await face.close(fn)


async def test_an_argument_that_cannot_be_fingerprinted_is_named(
    store: StoreURL, face: Face
) -> None:
    def send(order_id: str, conn: object) -> None:
        return None

    fn = face.define(send, store=store.url, key="order_id")
    try:
        with pytest.raises(ArgumentError, match=r"'conn'.*fingerprint=") as caught:
            await face.call(fn, "o-1", object())
    finally:
        await face.close(fn)
    # A bad argument of one call, not bad settings: a TypeError, as Python's own for a call.
    assert isinstance(caught.value, TypeError)
    assert not isinstance(caught.value, ConfigurationError)
    assert caught.value.argument == "conn"
    try:
        pass
    finally:
        await face.close(fn)


async def test_methods_key_and_fingerprint_without_self(store: StoreURL, face: Face) -> None:
    class Billing:
        def __init__(self) -> None:
            self.runs = 0

        def charge(self, order_id: str) -> int:
            self.runs += 1
            return self.runs

    Billing.charge = face.define(Billing.charge, store=store.url, key=lambda self, o: o)  # type: ignore[method-assign]
    a, b = Billing(), Billing()
    try:
        assert await face.call(a.charge, "o-1") == 1
        assert await face.call(b.charge, "o-1") == 1  # another object, the same call
    finally:
        await face.close(Billing.charge)
    assert (a.runs, b.runs) == (1, 0)


# -- exceptions --------------------------------------------------------------------------------


async def test_a_subclass_of_a_final_type_comes_back_as_itself(store: StoreURL, face: Face) -> None:
    class Overdrawn(ValueError):
        pass

    def charge(order_id: str) -> None:
        raise Overdrawn("overdrawn", 42)

    fn = face.define(charge, store=store.url, key="order_id", final=(ValueError,))
    try:
        with pytest.raises(Overdrawn):
            await face.call(fn, "o-1")
        with pytest.raises(ValueError) as again:
            await face.call(fn, "o-1")
    finally:
        await face.close(fn)
    # A class defined in a function is not importable by name: its final base stands in.
    assert type(again.value) in (Overdrawn, ValueError)
    assert again.value.args == ("overdrawn", 42)


async def test_committed_effects_then_an_exception_leave_the_outcome_unknown(
    store: StoreURL, face: Face
) -> None:
    runs: list[str] = []
    if face.is_async:

        async def pay(order_id: str) -> None:
            runs.append(order_id)
            assert await retrysafe.mark_committed()
            raise ConnectionError("lost the provider's answer")

        fn = idempotent_function(pay, store=store.url, key="order_id")
    else:

        def pay_sync(order_id: str) -> None:
            runs.append(order_id)
            assert sync_functions.mark_committed()
            raise ConnectionError("lost the provider's answer")

        fn = idempotent_function(pay_sync, store=store.url, key="order_id")
    try:
        with pytest.raises(ConnectionError):
            await face.call(fn, "o-1")
        with pytest.raises(OutcomeUnknownError, match="retrysafe resolve --function"):
            await face.call(fn, "o-1")
    finally:
        await face.close(fn)
    assert runs == ["o-1"]


# -- conflicts ---------------------------------------------------------------------------------


async def _while_running(store: StoreURL, face: Face, **options: Any) -> tuple[Any, Any, list[int]]:
    """Start a call that blocks until released; call again meanwhile; then release it.
    Returns (the first call's outcome, the second's, the runs)."""
    runs: list[int] = []
    if face.is_async:
        started, release = asyncio.Event(), asyncio.Event()

        async def slow(n: int) -> str:
            runs.append(n)
            started.set()
            await release.wait()
            return f"done-{n}"

        fn = idempotent_function(slow, store=store.url, key="n", **options)
        first = asyncio.ensure_future(fn(1))
        await started.wait()
    else:
        t_started, t_release = threading.Event(), threading.Event()

        def slow_sync(n: int) -> str:
            runs.append(n)
            t_started.set()
            t_release.wait(30)
            return f"done-{n}"

        fn = idempotent_function(slow_sync, store=store.url, key="n", **options)
        first = asyncio.ensure_future(asyncio.to_thread(fn, 1))
        await asyncio.to_thread(t_started.wait, 30)
    second = asyncio.ensure_future(face.call(fn, 1))
    await asyncio.sleep(0.3)
    if face.is_async:
        release.set()
    else:
        t_release.set()
    outcomes = await asyncio.gather(first, second, return_exceptions=True)
    await face.close(fn)
    return outcomes[0], outcomes[1], runs


async def test_a_duplicate_while_the_first_runs_raises_in_progress_with_retry_after(
    store: StoreURL, face: Face
) -> None:
    first, second, runs = await _while_running(store, face, lease=20.0)
    assert first == "done-1"
    assert isinstance(second, InProgressError)
    assert 1 <= second.retry_after <= 20
    assert runs == [1]


async def test_on_conflict_wait_returns_the_first_result(store: StoreURL, face: Face) -> None:
    first, second, runs = await _while_running(store, face, on_conflict="wait", conflict_wait=10.0)
    assert first == second == "done-1"
    assert runs == [1]


# -- configuration -----------------------------------------------------------------------------


def test_bad_options_are_named_at_decoration() -> None:
    def f(order_id: str) -> None:
        return None

    cases: list[tuple[dict[str, Any], str]] = [
        ({"key": "order"}, "key='order'.*has no such parameter.*order_id"),
        ({"fingerprint": ["nope"]}, "fingerprint='nope'"),
        ({"methods": {"POST"}}, "'methods' is an HTTP option"),
        ({"retries": 3}, "retries=.*unknown option"),
        ({"leese": 3}, "leese=.*did you mean lease"),
        ({"ttl": "1 day", "lease": "soon"}, "lease=.*soon"),
        ({"lease": -1}, "lease=.*must be positive"),
        ({"codec": "yaml"}, "codec must be"),
        ({"final": [KeyError, "x"]}, "final must list exception types"),
        ({"transactional": True}, "transactional=True needs a SQL store"),
        ({"store": "nosuch://x"}, "unknown store URL scheme"),
        ({"config": retrysafe.IdempotencyConfig(), "ttl": 5}, "either config= or keyword"),
    ]
    for options, message in cases:
        options = {"store": "memory://", **options}
        with pytest.raises(ConfigurationError, match=message):
            idempotent_function(f, **options)


def test_a_def_function_refuses_an_async_network_store(redis_url: str) -> None:
    from retrysafe.stores.redis import AsyncRedisStore

    def f(n: int) -> None:
        return None

    with pytest.raises(ConfigurationError, match="def function needs"):
        idempotent_function(f, store=AsyncRedisStore(redis_url), key="n")


def test_mark_committed_of_the_wrong_face_says_which_to_use() -> None:
    async def f(n: int) -> None:
        sync_functions.mark_committed()

    fn = idempotent_function(f, store="memory://", key="n")
    with pytest.raises(ConfigurationError, match=r"await retrysafe\.mark_committed"):
        asyncio.run(fn(1))


def test_outside_a_call_mark_committed_has_nothing_to_protect() -> None:
    assert sync_functions.mark_committed() is True
    assert asyncio.run(retrysafe.mark_committed()) is True
    with pytest.raises(ConfigurationError, match="no idempotent transaction for this call"):
        sync_functions.transaction()
    assert sync_functions.transaction(optional=True) is None
