"""What the sync runner needs from threads: lease renewal, background work, sleep and a clock.

The hand-written twin of ``_async/_keeper.py`` (same method names). Leases are renewed by one
daemon thread per middleware and process (restarted after ``fork``, so a pre-forking server's
workers each renew their own; ended after :data:`IDLE_SECONDS` with nothing to renew), never by
the request's thread, which is busy in the handler.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..stores._fork import reset_after_fork

__all__ = ["LeaseKeeper"]

logger = logging.getLogger("retrysafe")

#: How long a keeper's thread stays with nothing to renew before it ends (the next handler
#: starts another): an app made per test, or per tenant, must not leave a thread behind each.
IDLE_SECONDS = 5.0


class _Renewable(Protocol):
    def renew(self) -> bool: ...


class LeaseKeeper:
    """Renews the leases of the running handlers of one middleware and runs background work."""

    def __init__(self) -> None:
        self._reset()
        # Reset in a forked child (a pre-forking server's workers each renew their own leases):
        # one fork hook for all, no per-request ``getpid``.
        self._fork_hold = reset_after_fork(self)

    def _after_fork(self) -> None:
        self._reset()

    def _reset(self) -> None:
        # Also run in a forked child (_after_fork): the parent's thread and lock are not ours.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._active: dict[_Renewable, tuple[float, float]] = {}
        self._sweeper: threading.Thread | None = None
        self._wakes_at = 0.0  # when the sweeper wakes next (it sleeps at most 1 s)

    def add(self, item: _Renewable, interval: float) -> float:
        """Renew ``item`` every ``interval`` seconds until discarded or its renewal fails.

        Returns:
            The clock now (:meth:`clock`), so a caller that times the item needs no other call.
        """
        now = time.monotonic()
        due = now + interval
        with self._lock:  # the condition's own lock, without its Python-level wrapper
            self._active[item] = (due, interval)
            if self._sweeper is None:
                self._sweeper = threading.Thread(
                    target=self._sweep, name="retrysafe-leases", daemon=True
                )
                self._sweeper.start()
            if due < self._wakes_at:
                # Due before the sweeper's next wake (a lease under 3 s): wake it now. With the
                # usual leases it wakes in time anyway, and a notify per request is not free.
                self._cond.notify()
        return now

    def discard(self, item: _Renewable) -> float:
        """Stop renewing ``item``. Returns the clock now (:meth:`clock`)."""
        with self._lock:
            self._active.pop(item, None)
        return time.monotonic()

    def spawn(self, function: Callable[..., None], *args: Any) -> None:
        """Run ``function(*args)`` in a background thread."""
        threading.Thread(
            target=function, args=args, name="retrysafe-background", daemon=True
        ).start()

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds``."""
        time.sleep(seconds)

    def clock(self) -> float:
        """Monotonic seconds."""
        return time.monotonic()

    def _sweep(self) -> None:
        idle_since = -1.0
        while True:
            with self._cond:
                now = time.monotonic()
                due = [item for item, (at, _) in self._active.items() if at <= now]
                for item in due:
                    self._active[item] = (now + self._active[item][1], self._active[item][1])
                if self._active:
                    idle_since = -1.0
                elif idle_since < 0:
                    idle_since = now
                elif now - idle_since >= IDLE_SECONDS:
                    self._sweeper = None  # under the lock: the next add starts another
                    return
                if not due:
                    wait = min((at for at, _ in self._active.values()), default=now + 60) - now
                    wait = min(1.0, max(0.005, wait))
                    self._wakes_at = now + wait
                    self._cond.wait(timeout=wait)
            for item in due:  # none after a wait: the loop starts over
                try:
                    ok = item.renew()
                except Exception:  # never let one renewal end the thread
                    logger.exception("lease renewal failed")
                    continue
                if not ok:
                    self.discard(item)
