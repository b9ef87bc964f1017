"""The sans-I/O decisions: what to do with a request once the store has answered.

No I/O and no framework here; the ASGI/WSGI shells drive it.
"""

from __future__ import annotations

import enum
import math

from .stores._base import Reservation

__all__ = ["Decision", "decide", "retry_after"]


class Decision(enum.Enum):
    """What the shell does with a request after ``reserve``."""

    EXECUTE = "execute"
    """This request won the key: run the handler, then complete or release."""
    REPLAY = "replay"
    """A completed record for the same request: answer with the stored response."""
    IN_PROGRESS = "in_progress"
    """The first request is still running: 409 (or wait and replay)."""
    MISMATCH = "mismatch"
    """The key was used with a different request: 422, nothing runs."""
    OUTCOME_UNKNOWN = "outcome_unknown"
    """The first request committed its effects, then its process died before storing the
    response: 409 until an operator resolves the key or its retention ends, never a rerun."""


def decide(reservation: Reservation, fingerprint: str) -> Decision:
    """Map a reservation outcome to a decision.

    Args:
        reservation: what ``store.reserve`` returned.
        fingerprint: the fingerprint of the current request.

    Returns:
        The decision. A different request is a mismatch even while the first still runs, so a
        client bug surfaces at once rather than after a retry.
    """
    if reservation.acquired:
        return Decision.EXECUTE
    record = reservation.record
    if record is None:  # pragma: no cover - a store contract violation
        raise ValueError("a reservation holds either a token or a record")
    if record.fingerprint != fingerprint:
        return Decision.MISMATCH
    if record.state == "completed":
        return Decision.REPLAY
    if record.committed and record.lease_remaining <= 0:
        return Decision.OUTCOME_UNKNOWN
    return Decision.IN_PROGRESS


def retry_after(lease_remaining: float) -> int:
    """Seconds a client should wait before retrying an in-progress key (at least 1)."""
    return max(1, math.ceil(lease_remaining))
