"""The async httpx transport that retries through the shared :class:`RetryPolicy`.

The sync twin, ``_sync/transport.py``, is generated from this file by ``scripts/unasync.py``
(``make lint`` checks it is up to date): edit this file, then run the script.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx

from .._httpx import annotate, classify, start_call
from .._policy import RetryPolicy
from .retry import send_with_retries

__all__ = ["AsyncRetryingTransport"]


class AsyncRetryingTransport(httpx.AsyncBaseTransport):
    """An httpx transport that adds idempotency keys and retries safely.

    Example::

        client = httpx.AsyncClient(transport=AsyncRetryingTransport())
        response = await client.post("https://api.example/orders", json={...})
        retry_info(response)   # RetryInfo(key=..., attempts=2, replayed=True)

    Args:
        transport: the transport that sends (default ``httpx.AsyncHTTPTransport()``).
        policy: when to resend (default ``RetryPolicy()``).
        sleep: how to wait between attempts (default ``asyncio.sleep``; injectable for tests).
    """

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        policy: RetryPolicy | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.transport = transport if transport is not None else httpx.AsyncHTTPTransport()
        self.policy = policy if policy is not None else RetryPolicy()
        self._sleep = sleep

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` until the policy is satisfied; see :class:`RetryPolicy`."""
        call = start_call(self.policy, request)

        async def attempt() -> httpx.Response:
            response = await self.transport.handle_async_request(request)
            if call.key is not None or call.wants_body(response.status_code):
                # Read whole here, so a connection lost mid-body is retried with the same key.
                try:
                    await response.aread()
                except BaseException:
                    await response.aclose()
                    raise
            return response

        response = await send_with_retries(
            call, attempt, errors=httpx.TransportError, classify=classify, sleep=self._sleep
        )
        return annotate(call, response)

    async def aclose(self) -> None:
        """Close the wrapped transport."""
        await self.transport.aclose()
