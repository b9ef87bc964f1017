"""What the async runner needs from asyncio: lease renewal, background work, sleep and a clock.

Hand-written, with a twin of the same method names in ``_sync/_keeper.py`` (threads), so that
the runner itself is written once and its sync twin generated (``scripts/unasync.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

__all__ = ["AsyncLeaseKeeper"]

logger = logging.getLogger("retrysafe")

#: How long a loop's sweeper stays with nothing to renew before it ends.
IDLE_SECONDS = 5.0


class _Renewable(Protocol):
    async def renew(self) -> bool: ...


class _LoopKeeper:
    """The running handlers of one event loop, renewed by one sweeping task.

    One task per loop, not a timer per request: a timer per request costs a ``call_later`` and
    leaves a cancelled entry in the loop's heap for every fast request (the common case). The
    sweeper sleeps until the next lease is due (at most 1 s; an item due sooner wakes it) and
    ends only after :data:`IDLE_SECONDS` with nothing running: a server's requests come one after
    another, and a sweeper that ended whenever none ran would be a new task per request.
    """

    __slots__ = ("active", "loop", "task", "wake", "wakes_at")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.active: dict[_Renewable, tuple[float, float]] = {}
        self.task: asyncio.Task[None] | None = None
        self.wake: asyncio.Future[None] | None = None  # resolved to wake the sweeper early
        self.wakes_at = 0.0

    async def _sweep(self) -> None:
        renewals: set[asyncio.Task[None]] = set()
        loop = self.loop
        idle_since = -1.0
        while True:
            now = time.monotonic()  # the clock of the due times (AsyncLeaseKeeper.add)
            for item, (due, interval) in list(self.active.items()):
                if due <= now:
                    self.active[item] = (now + interval, interval)
                    task = loop.create_task(self._renew(item))
                    renewals.add(task)
                    task.add_done_callback(renewals.discard)
            if self.active:
                idle_since = -1.0
            elif idle_since < 0:
                idle_since = now
            elif now - idle_since >= IDLE_SECONDS:
                return
            wait = min((due for due, _ in self.active.values()), default=now + 1.0) - now
            wait = min(1.0, max(0.005, wait))
            self.wakes_at = now + wait
            self.wake = wake = loop.create_future()
            timer = loop.call_later(wait, _resolve, wake)
            try:
                await wake
            finally:
                timer.cancel()

    async def _renew(self, item: _Renewable) -> None:
        if not await item.renew():
            self.active.pop(item, None)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class AsyncLeaseKeeper:
    """Renews the leases of the running handlers of one middleware (one sweeper per event
    loop: a middleware may serve several loops, e.g. in tests) and runs background work."""

    __slots__ = ("_current", "_loops", "_tasks")

    def __init__(self) -> None:
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopKeeper] = (
            weakref.WeakKeyDictionary()
        )
        self._current: _LoopKeeper | None = None
        self._tasks: set[asyncio.Future[None]] = set()

    def _keeper(self) -> _LoopKeeper:
        loop = asyncio.get_running_loop()
        keeper = self._current
        if keeper is None or keeper.loop is not loop:
            keeper = self._loops.get(loop)
            if keeper is None:
                keeper = self._loops[loop] = _LoopKeeper(loop)
            self._current = keeper
        return keeper

    def add(self, item: _Renewable, interval: float) -> float:
        """Renew ``item`` every ``interval`` seconds until discarded or its renewal fails.

        Returns:
            The clock now (:meth:`clock`), so a caller that times the item needs no other call.
        """
        now = time.monotonic()
        keeper = self._current
        if keeper is None or keeper.loop is not asyncio.get_running_loop():
            keeper = self._keeper()
        due = now + interval
        keeper.active[item] = (due, interval)
        # Start the loop's sweeper, or wake it if the item is due before it.
        task = keeper.task
        if task is None or task.done():
            keeper.task = keeper.loop.create_task(keeper._sweep())
        elif due < keeper.wakes_at and keeper.wake is not None and not keeper.wake.done():
            keeper.wake.set_result(None)
        return now

    def discard(self, item: _Renewable) -> float:
        """Stop renewing ``item``. Returns the clock now (:meth:`clock`)."""
        keeper = self._current
        if keeper is None or keeper.loop is not asyncio.get_running_loop():
            keeper = self._keeper()
        keeper.active.pop(item, None)
        return time.monotonic()

    def spawn(self, function: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run ``function(*args)`` in the background (kept referenced until it ends)."""
        task = asyncio.ensure_future(function(*args))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``."""
        await asyncio.sleep(seconds)

    def clock(self) -> float:
        """Monotonic seconds (the clock asyncio's own loop uses; a C call, no loop lookup)."""
        return time.monotonic()
