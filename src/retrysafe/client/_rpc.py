"""When a unary gRPC call is sent again, sans-I/O: the decision the gRPC client interceptors
(:mod:`retrysafe.contrib.grpc`) follow between attempts. Every attempt of one logical call
carries the same ``idempotency-key``, so a resend is safe whatever happened to the one before.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterable

__all__ = ["RETRYABLE_CODES", "resend_delay"]

#: What is resent: the server is unreachable or went away (the call may or may not have run;
#: the key makes the resend safe), or the first call with the key still runs (``ABORTED`` with
#: a delay from a retrysafe server).
RETRYABLE_CODES = frozenset({"UNAVAILABLE", "ABORTED"})

#: The longest wait between two attempts.
MAX_DELAY = 30.0


def resend_delay(
    code: str,
    trailing: Iterable[tuple[str, str | bytes]],
    attempt: int,
    retries: int,
    *,
    backoff: float = 0.1,
) -> float | None:
    """How long to wait before sending the call again, or ``None``: end with this outcome.

    Args:
        code: the status code's name of the attempt that just ended.
        trailing: its trailing metadata (a replay is final; ``grpc-retry-pushback-ms`` or
            ``retry-after`` set the delay).
        attempt: how many attempts were made (1 after the first).
        retries: how many resends are allowed.
        backoff: the first exponential backoff step, when the server names no delay.
    """
    if code not in RETRYABLE_CODES or attempt > retries:
        return None
    pushback: float | None = None
    for name, value in trailing:
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        if name == "grpc-retry-pushback-ms":
            try:
                pushback = int(text) / 1000
            except ValueError:
                return None  # the server asks not to retry
        elif name == "retry-after" and pushback is None:
            with contextlib.suppress(ValueError):  # an HTTP date is not sent on gRPC
                pushback = float(text)
    if pushback is not None:
        return min(max(pushback, 0.0), MAX_DELAY)
    step: float = backoff * 2 ** (attempt - 1)
    return min(step * (0.5 + random.random() / 2), MAX_DELAY)
