"""The sans-I/O decision table and Retry-After."""

from __future__ import annotations

import pytest

from retrysafe._flow import Decision, decide, retry_after
from retrysafe.stores import Record, Reservation

FP = "f" * 64


@pytest.mark.parametrize(
    ("reservation", "decision"),
    [
        (Reservation(token="t"), Decision.EXECUTE),
        (Reservation(record=Record(FP, "completed", b"resp")), Decision.REPLAY),
        (Reservation(record=Record(FP, "in_progress", lease_remaining=3.0)), Decision.IN_PROGRESS),
        (Reservation(record=Record("other", "completed", b"resp")), Decision.MISMATCH),
        (
            Reservation(record=Record("other", "in_progress", lease_remaining=3.0)),
            Decision.MISMATCH,
        ),
    ],
    ids=["won", "completed-same", "running-same", "completed-other", "running-other"],
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
