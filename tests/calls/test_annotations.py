"""A result comes back as the return annotation says, or the function refuses to run: an
annotation that cannot be resolved at run time (a type imported under ``TYPE_CHECKING``, a
dataclass whose fields name one) fails loudly, naming it, before the first call runs, instead of
handing back raw JSON on every replay. Generator functions are refused at decoration."""

from __future__ import annotations

import dataclasses
import datetime
from typing import TYPE_CHECKING, Any

import pytest

from retrysafe import ConfigurationError, idempotent_function

if TYPE_CHECKING:
    from decimal import Decimal as HiddenDecimal  # for type checkers only: not at run time


@dataclasses.dataclass
class Box:
    amount: HiddenDecimal


def test_a_type_imported_for_type_checkers_only_fails_before_running() -> None:
    runs: list[int] = []

    def price(n: int) -> HiddenDecimal:
        runs.append(n)
        raise AssertionError("never runs")

    fn = idempotent_function(price, store="memory://", key="n")
    with pytest.raises(ConfigurationError, match=r"price\(\).*'HiddenDecimal'"):
        fn(1)
    with pytest.raises(ConfigurationError, match="HiddenDecimal"):
        fn(1)  # and again: never a run whose result would come back as another type
    assert runs == []


def test_a_dataclass_whose_field_cannot_be_resolved_fails_before_running() -> None:
    def boxed(n: int) -> Box:
        raise AssertionError("never runs")

    fn = idempotent_function(boxed, store="memory://", key="n")
    with pytest.raises(ConfigurationError, match=r"Box.*HiddenDecimal"):
        fn(1)


def test_a_class_defined_inside_a_function_comes_back_as_itself() -> None:
    @dataclasses.dataclass
    class Receipt:
        on: datetime.date

    runs: list[int] = []

    @idempotent_function(store="memory://", key="n")
    def issue(n: int) -> Receipt:
        runs.append(n)
        return Receipt(datetime.date(2024, 1, 2))

    first, again = issue(1), issue(1)
    assert runs == [1]
    assert type(again) is Receipt and again == first
    assert type(again.on) is datetime.date


def test_a_class_defined_after_the_decoration_is_resolved_at_the_first_call() -> None:
    fn = idempotent_function(_later, store="memory://", key="n")
    first, again = fn(1), fn(1)
    assert type(again) is Later and again == first == Later(datetime.date(2024, 1, 2))


def _later(n: int) -> Later:
    return Later(datetime.date(2024, 1, 2))


@dataclasses.dataclass
class Later:
    on: datetime.date


def test_pickle_needs_no_annotation() -> None:
    def price(n: int) -> HiddenDecimal:
        from decimal import Decimal

        return Decimal(n)

    fn = idempotent_function(price, store="memory://", key="n", codec="pickle")
    assert fn(1) == fn(1) == 1


def test_generator_functions_are_refused_at_decoration() -> None:
    def numbers(n: int) -> Any:
        yield n

    async def anumbers(n: int) -> Any:
        yield n

    for function in (numbers, anumbers):
        with pytest.raises(ConfigurationError, match="generator"):
            idempotent_function(function, store="memory://", key="n")
