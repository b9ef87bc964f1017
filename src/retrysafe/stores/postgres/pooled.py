"""The store's asyncpg pool hygiene, for an application's own asyncpg pool (OrderHub's data
layer uses it): statements on connections the store does not own fail and recover as the
store's do. Imports asyncpg.

- :func:`run_pooled` runs one piece of work on a pooled connection: a connection on which it
  failed is terminated, never handed out again; one the server had closed while idle (nothing
  was sent) is skipped for the next; a lost server is :class:`~retrysafe.StoreUnavailableError`.
- :func:`store_error` says what an asyncpg error on a connection means, in the store's words.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..._core.errors import StoreError, StoreUnavailableError
from ._asyncpg import _asyncpg_error, _discard, _give_back, _never_sent
from ._sql import STORE_NAME

__all__ = ["run_pooled", "store_error"]

T = TypeVar("T")


def store_error(exc: BaseException, *, what: str, closed: bool = False) -> StoreError:
    """The store error an asyncpg (or socket) error stands for.

    Args:
        exc: the error.
        what: what failed, for the message (``"insert"``).
        closed: the connection it came from is closed now (then it is a lost connection,
            whatever the error says).

    Returns:
        A :class:`~retrysafe.StoreUnavailableError` when the server is gone or unreachable,
        else a :class:`~retrysafe.StoreError`.
    """
    return _asyncpg_error(exc, established=False, what=what, closed=closed)


async def run_pooled(
    pool: Any,
    work: Callable[[Any], Awaitable[T]],
    *,
    attempts: int,
    acquire_timeout: float = 10.0,
    what: str = "statement",
) -> T:
    """Run ``work(connection)`` on a connection of an asyncpg ``pool``.

    Args:
        pool: an ``asyncpg.Pool``.
        work: the statements, given the connection.
        attempts: how many connections to try when the server had closed them while idle (one
            more than the pool holds reaches a new one).
        acquire_timeout: seconds to wait for a connection.
        what: what the work does, for messages.

    Raises:
        StoreUnavailableError: no connection could be had, or the server went away.
        Exception: ``work``'s own error (a SQL error) as it was raised.
    """
    for _ in range(attempts):
        try:
            conn = await asyncio.wait_for(pool.acquire(), acquire_timeout)
        except Exception as exc:
            raise _asyncpg_error(exc, established=False, what="connect") from exc
        try:
            return await work(conn)
        except Exception as exc:
            closed = conn.is_closed()
            _discard(conn)
            if _never_sent(exc):
                continue
            error = _asyncpg_error(exc, established=True, what=what, closed=closed)
            if isinstance(error, StoreUnavailableError):
                raise error from exc
            raise
        finally:
            await _give_back(pool, conn)
    raise StoreUnavailableError(
        f"PostgreSQL {what} failed: no live connection in the pool", store=STORE_NAME
    )
