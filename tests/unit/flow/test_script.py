"""The scripted driver fails loudly: a test that scripts the wrong world cannot pass."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from retrysafe import StoreError

from .script import ANY, run


def _phase() -> Generator[tuple[str, Any], Any, str]:
    try:
        got = yield "reserve", None
    except StoreError:
        return "caught"
    yield "emit", got
    return "done"


def test_results_are_sent_back_and_the_verdict_returned() -> None:
    result = run(_phase(), [("reserve", None, "x"), ("emit", "x")])
    assert result.value == "done"
    assert result.actions == [("reserve", None), ("emit", "x")]


def test_a_scripted_exception_is_thrown_into_the_phase() -> None:
    assert run(_phase(), [("reserve", None, StoreError("down"))]).value == "caught"


def test_any_matches_every_argument() -> None:
    assert run(_phase(), [("reserve", ANY, 1), ("emit", ANY)]).value == "done"


def test_an_unexpected_action_fails() -> None:
    with pytest.raises(AssertionError, match="expected \\('emit', 'y'\\)"):
        run(_phase(), [("reserve", None, "x"), ("emit", "y")])


def test_an_action_after_the_script_ended_fails() -> None:
    with pytest.raises(AssertionError, match="after the script ended"):
        run(_phase(), [("reserve", None, "x")])


def test_a_phase_that_ends_before_the_script_fails() -> None:
    with pytest.raises(AssertionError, match="steps left"):
        run(_phase(), [("reserve", None, StoreError("down")), ("emit", None)])


def test_a_phase_that_raises_before_the_script_ends_fails() -> None:
    with pytest.raises(AssertionError, match="raised"):
        run(_phase(), [("reserve", None, KeyError("k")), ("emit", None)])


def test_what_a_phase_raises_at_the_end_of_its_script_propagates() -> None:
    with pytest.raises(KeyError):
        run(_phase(), [("reserve", None, KeyError("k"))])


def test_no_steps_means_no_script() -> None:
    assert run(None, []).value is None
    with pytest.raises(AssertionError, match="no steps"):
        run(None, [("tx_close", None)])
