"""A clock the test moves by hand, for stores and middleware that take ``clock=``."""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    """Returns ``now``; tests advance it instead of sleeping."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now
