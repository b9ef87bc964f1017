# Generated from src/retrysafe/_core/drive.py by scripts/unasync.py: do not edit.
"""The one action loop: run a generator of actions, performing each one and sending back what
it gave (or throwing in what it raised), until the generator returns its result.

Every sans-I/O piece of the library is such a generator: the request flow's phases (actions
like ``RESERVE`` or ``SLEEP``, performed by the runners), the PostgreSQL store's operations
(queries, sent by a driver), the Redis store's conflict handling (script calls). The policy for a
failed action lives in the generator (it catches what is thrown in, or lets it propagate); this
loop only carries actions out and results back.

This file is generated from ``drive.py`` by ``scripts/unasync.py``: edit that file, then run
the script.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Protocol, TypeVar

__all__ = ["Performer", "drive"]

A = TypeVar("A")
A_contra = TypeVar("A_contra", contravariant=True)
T = TypeVar("T")


class Performer(Protocol[A_contra]):
    """What carries out the actions of one kind of generator: a runner's request, a store's
    driver."""

    def perform(self, action: A_contra) -> Any:
        """Carry out one action; what it gives is sent back into the generator."""
        ...


def drive(steps: Generator[A, Any, T], performer: Performer[A]) -> T:
    """Run ``steps`` to its end.

    Args:
        steps: the generator: yields actions, receives their results, returns its own result.
        performer: carries out each action. An object with a method rather than a callable:
            passing a bound method would make one (a garbage-collected object) per call, which
            the request's hot path measurably pays for.

    Returns:
        What ``steps`` returned.
    """
    try:
        action = next(steps)
        while True:
            try:
                result = performer.perform(action)
            except BaseException as exc:
                # Cancellation and exit too: the generator decides (it usually lets them pass).
                action = steps.throw(exc)
            else:
                action = steps.send(result)
    except StopIteration as stop:
        value: T = stop.value
        return value
