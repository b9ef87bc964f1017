"""Waiting for SQLite's write lock without blocking the event loop: the busy error, the turns in
which one loop's waiters for one file poll the lock, and the awaited back-off
(:func:`retry_while_busy`) the async face and the demo's data layer use."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import sqlite3
import weakref
from collections.abc import Callable
from typing import TypeVar

from ..._core.errors import StoreError, StoreUnavailableError

__all__ = [
    "CLAIM",
    "DEFAULT_BUSY_TIMEOUT",
    "SETTLE",
    "SQLiteBusyError",
    "file_key",
    "retry_while_busy",
    "store_error",
]

DEFAULT_BUSY_TIMEOUT = 30.0
"""Seconds a write waits for SQLite's lock when no ``busy_timeout`` is given (and no lease
bounds it): the middleware's default lease, so a request queues about as long as a lease."""

T = TypeVar("T")


class SQLiteBusyError(StoreUnavailableError):
    """Another connection holds the database's write lock (``SQLITE_BUSY``)."""


def store_error(operation: str, exc: sqlite3.Error) -> StoreError:
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc)
        if "locked" in text or "busy" in text:
            return SQLiteBusyError(f"SQLite {operation}: {text}", store="sqlite")
        return StoreUnavailableError(f"SQLite {operation} failed: {text}", store="sqlite")
    return StoreError(f"SQLite {operation} failed: {exc}", store="sqlite")


def _is_busy(exc: BaseException) -> bool:
    if isinstance(exc, SQLiteBusyError):
        return True
    text = str(exc)
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


class _Turns:
    """The coroutines of one event loop that wait for one SQLite file's write lock, served in
    turn: only the one whose turn it is polls the lock, the others wait in order (the settling
    of a key that is already held before a new reservation, then first come, first served).

    SQLite has no queue of its own: every waiter retries, and one that arrives when the lock is
    free takes it ahead of those that have waited for seconds. On a busy file that is the tail
    of the latency (a request that loses the race again and again); with turns, a waiter
    competes only with the heads of the other processes' queues.
    """

    __slots__ = ("heap", "held", "seq")

    def __init__(self) -> None:
        self.held = False
        self.heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self.seq = itertools.count()

    async def acquire(self, priority: int, within: float) -> bool:
        """Wait for this waiter's turn, at most ``within`` seconds; ``False`` if it did not
        come (then the caller does not hold it)."""
        if not self.held and not self.heap:
            self.held = True
            return True
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self.heap, (priority, next(self.seq), turn))
        try:
            await asyncio.wait((turn,), timeout=within)
        except asyncio.CancelledError:
            self._abandon(turn)
            raise
        if turn.done():
            return True
        self._abandon(turn)
        return False

    def _abandon(self, turn: asyncio.Future[None]) -> None:
        if turn.done():
            self.release()  # handed over just now: pass it on
        else:
            turn.cancel()

    def release(self) -> None:
        """End the current turn: the next waiter's begins."""
        while self.heap:
            turn = heapq.heappop(self.heap)[2]
            if not turn.done():
                turn.set_result(None)
                return
        self.held = False


_TURNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Turns]] = (
    weakref.WeakKeyDictionary()
)

#: Turn priorities: settling a key already held (and a held key's transaction) goes first.
SETTLE, CLAIM = 0, 1


def _turns(path: str) -> _Turns:
    files = _TURNS.setdefault(asyncio.get_running_loop(), {})
    turns = files.get(path)
    if turns is None:
        turns = files[path] = _Turns()
    return turns


async def retry_while_busy(
    operation: Callable[[], T],
    *,
    busy_timeout: float,
    what: str,
    path: str | None = None,
    priority: int = CLAIM,
    settled: Callable[[], T | None] | None = None,
) -> T:
    """Run ``operation`` (SQLite calls on a ``busy_timeout=0`` connection) and, while it meets
    another writer's lock, run it again after an awaited back-off: the event loop keeps serving
    the other requests, among them possibly the one that holds the lock.

    Args:
        operation: raises :class:`SQLiteBusyError` or ``sqlite3.OperationalError`` ("database
            is locked") when the lock is taken; any other error propagates at once.
        busy_timeout: seconds to keep trying (0: one attempt).
        what: the operation's name, for the error message.
        path: the database file: the waiters of this event loop for that file then take turns
            (see :class:`_Turns`) instead of racing each other for the lock.
        priority: :data:`SETTLE` (a key already held) or :data:`CLAIM` (a new write).
        settled: a read that may make the write unnecessary (a reservation whose key got a
            record meanwhile), tried while waiting for a turn; ``None`` from it: keep waiting.

    Returns:
        What ``operation`` returned.

    Raises:
        SQLiteBusyError: the lock stayed taken for ``busy_timeout`` seconds.
    """
    try:
        return operation()
    except (SQLiteBusyError, sqlite3.OperationalError) as exc:
        if not _is_busy(exc):
            raise
        first = exc
    loop = asyncio.get_running_loop()
    deadline = loop.time() + busy_timeout
    turns = None
    if path is not None and path != ":memory:":
        turns = _turns(path)
        while True:
            left = deadline - loop.time()
            if await turns.acquire(priority, min(left, 0.05) if settled else max(0.0, left)):
                break
            if settled is not None:
                try:
                    answer = settled()
                except (SQLiteBusyError, sqlite3.OperationalError) as exc:
                    if not _is_busy(exc):
                        raise
                    answer = None
                if answer is not None:
                    return answer
            if loop.time() >= deadline:
                raise _busy_for(what, busy_timeout) from first
    try:
        delay = 0.0005
        while True:
            now = loop.time()
            if now >= deadline:
                raise _busy_for(what, busy_timeout) from first
            await asyncio.sleep(min(delay, deadline - now))
            # Alone in its turn, a waiter polls often: a free lock is taken within 5 ms.
            delay = min(delay * 2, 0.005 if turns is not None else 0.02)
            try:
                return operation()
            except (SQLiteBusyError, sqlite3.OperationalError) as exc:
                if not _is_busy(exc):
                    raise
    finally:
        if turns is not None:
            turns.release()


def _busy_for(what: str, busy_timeout: float) -> SQLiteBusyError:
    return SQLiteBusyError(
        f"SQLite {what}: the database's write lock stayed taken for {busy_timeout:g} s "
        "(busy_timeout); another transaction holds it",
        store="sqlite",
    )


def file_key(path: str) -> str:
    """The name under which the waiters for ``path``'s write lock take turns (its real path)."""
    return path if path == ":memory:" else os.path.realpath(path)
