"""The call contract, the same tests over every call front: ``def`` and ``async def`` functions,
the consumer (``MessageHandler``), Celery, Dramatiq, Huey, taskiq, RQ and arq (ids ``def``,
``async-def``, ``consumer``, ``celery``, ``dramatiq``, ``huey``, ``taskiq``, ``rq``, ``arq``).

A new front (a NATS consumer, gRPC...) passes this suite by adding ONE class to
``tests/calls/fronts.py`` and ONE ``pytest.param`` to its ``FRONTS``: the class answers
``fronts.CallFront`` (``define`` a body idempotent the way the front's users write it, ``send`` one
delivery with a key through the front's own machinery, ``returns_results``, ``close``). The body
is always a ``def``: each front wraps it as it must (``async-def`` makes an ``async def`` of it).

What a front does beyond this contract (a queue's redelivery after a killed worker, the
worker-start check, a copy that meets a live run) is tested with real workers in
``tests/tasks/``.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from retrysafe import ConfigurationError, KeyReusedError
from retrysafe.testing import idempotency_disabled

from .conftest import StoreURL
from .fronts import FRONTS, CallFront


@pytest.fixture(params=FRONTS)
def front(request: pytest.FixtureRequest) -> Iterator[CallFront]:
    made: CallFront = request.param()
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def url(store: StoreURL) -> str:
    """Every store in turn (``tests/calls/conftest.py``), fresh for each test."""
    return store.url


@dataclass(frozen=True)
class Receipt:
    order: str
    amount: int
    on: datetime.date


class Declined(Exception):
    """A final outcome: stored, raised again for every copy."""


def test_one_key_runs_once_and_every_copy_gets_the_stored_result(
    front: CallFront, url: str
) -> None:
    runs: list[str] = []

    def charge(order: str, amount: int) -> Receipt:
        runs.append(order)
        return Receipt(order, amount, datetime.date(2024, 1, 2))

    handle = front.define(charge, store=url, name="contract.charge")
    first = front.send(handle, "k-1", "o-1", 100)
    again = front.send(handle, "k-1", "o-1", 100)
    assert first.error is None and again.error is None
    assert runs == ["o-1"]
    if front.returns_results:
        expected = Receipt("o-1", 100, datetime.date(2024, 1, 2))
        assert first.value == expected and again.value == expected
        assert type(again.value.on) is datetime.date  # typed back by the annotation


def test_another_key_runs_again(front: CallFront, url: str) -> None:
    runs: list[str] = []

    def charge(order: str) -> str:
        runs.append(order)
        return order

    handle = front.define(charge, store=url, name="contract.charge")
    assert front.send(handle, "k-1", "o-1").error is None
    assert front.send(handle, "k-2", "o-1").error is None
    assert runs == ["o-1", "o-1"]


def test_the_key_sent_with_other_arguments_is_refused_and_nothing_runs(
    front: CallFront, url: str
) -> None:
    runs: list[str] = []

    def charge(order: str, amount: int) -> str:
        runs.append(order)
        return order

    handle = front.define(charge, store=url, name="contract.charge")
    assert front.send(handle, "k-1", "o-1", 100).error is None
    reused = front.send(handle, "k-1", "o-1", 999)
    assert isinstance(reused.error, KeyReusedError)
    assert reused.error.function == "contract.charge" and len(reused.error.record) == 16
    assert front.send(handle, "k-1", "o-1", 100).error is None  # the same call still is
    assert runs == ["o-1"]


def test_an_exception_frees_the_key_for_the_next_delivery(front: CallFront, url: str) -> None:
    runs: list[int] = []

    def charge(order: str) -> str:
        runs.append(len(runs))
        if len(runs) == 1:
            raise ConnectionError("provider down")
        return order

    handle = front.define(charge, store=url, name="contract.charge")
    failed = front.send(handle, "k-1", "o-1")
    assert isinstance(failed.error, ConnectionError)
    assert front.send(handle, "k-1", "o-1").error is None
    assert front.send(handle, "k-1", "o-1").error is None  # stored now
    assert runs == [0, 1]


def test_a_final_exception_is_the_stored_outcome_of_every_copy(front: CallFront, url: str) -> None:
    runs: list[str] = []

    def charge(order: str) -> str:
        runs.append(order)
        raise Declined(f"card declined for {order}")

    handle = front.define(charge, store=url, name="contract.charge", final=[Declined])
    first = front.send(handle, "k-1", "o-1")
    again = front.send(handle, "k-1", "o-1")
    assert type(first.error) is Declined and type(again.error) is Declined
    assert again.error.args == ("card declined for o-1",)
    assert any("stored outcome" in note for note in again.error.__notes__)
    assert runs == ["o-1"]


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"required": True}, "'required' is an HTTP option"),
        ({"ttl": "soon"}, "ttl"),
        ({"fingerprint": ["nope"]}, "nope"),
    ],
    ids=["http-option", "bad-value", "no-such-parameter"],
)
def test_a_bad_option_is_named_at_definition(
    front: CallFront, url: str, options: dict[str, Any], named: str
) -> None:
    def charge(order: str) -> str:
        return order

    with pytest.raises(ConfigurationError, match=named):
        front.define(charge, store=url, name="contract.charge", **options)


def test_the_testing_switch_turns_the_front_off(front: CallFront, url: str) -> None:
    """``idempotency_disabled()`` (and so the ``retrysafe_disabled`` fixture and ``pytest
    --retrysafe-disable``) reaches every front's delivery path, not only a direct call."""
    runs: list[str] = []

    def charge(order: str) -> str:
        runs.append(order)
        return order

    handle = front.define(charge, store=url, name="contract.charge")
    with idempotency_disabled():
        assert front.send(handle, "k-1", "o-1").error is None
        assert front.send(handle, "k-1", "o-1").error is None
    assert runs == ["o-1", "o-1"]
    front.send(handle, "k-1", "o-1")
    front.send(handle, "k-1", "o-1")
    assert runs == ["o-1", "o-1", "o-1"]  # on again: nothing was stored while it was off
