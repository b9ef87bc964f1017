"""Async resources that follow the running event loop (``asyncio.run`` twice, a test suite's
loop per test): one per loop, opened on first use in it and closed while that loop shuts down.

A connection or a pool belongs to the loop it was opened in; a store object outlives loops. The
closing rides on the loop's own shutdown: :func:`close_with_loop` parks an async generator in the
loop, and ``asyncio.run`` (like any runner that calls ``loop.shutdown_asyncgens()``) finalizes it
before closing the loop, which runs the resource's ``aclose`` in that loop while it still runs.
A loop closed without that step leaves its resource open: it is dropped, never used again.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable

__all__ = ["close_with_loop"]


async def _until_loop_ends(close: Callable[[], Awaitable[None]]) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        await close()


async def close_with_loop(close: Callable[[], Awaitable[None]]) -> AsyncGenerator[None, None]:
    """Arrange for ``close()`` to be awaited when the running loop shuts down its async
    generators. Returns the parked generator: keep a reference to it (the loop holds it
    weakly); ``aclose()`` on it closes the resource now."""
    guard = _until_loop_ends(close)
    await guard.__anext__()
    return guard
