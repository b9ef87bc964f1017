# Generated from src/retrysafe/client/_async/transport.py by scripts/unasync.py: do not edit.
"""The sync httpx transport that retries through the shared :class:`RetryPolicy`.

This file is generated from ``_async/transport.py`` by ``scripts/unasync.py``
(``make lint`` checks it): edit that file, then run the script.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from .._httpx import annotate, classify, start_call
from .._policy import RetryPolicy
from .retry import send_with_retries

__all__ = ["RetryingTransport"]


class RetryingTransport(httpx.BaseTransport):
    """An httpx transport that adds idempotency keys and retries safely.

    Example::

        client = httpx.Client(transport=RetryingTransport())
        response = client.post("https://api.example/orders", json={...})
        retry_info(response)   # RetryInfo(key=..., attempts=2, replayed=True)

    Args:
        transport: the transport that sends (default ``httpx.HTTPTransport()``).
        policy: when to resend (default ``RetryPolicy()``).
        sleep: how to wait between attempts (default ``time.sleep``; injectable for tests).
    """

    def __init__(
        self,
        transport: httpx.BaseTransport | None = None,
        *,
        policy: RetryPolicy | None = None,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self.transport = transport if transport is not None else httpx.HTTPTransport()
        self.policy = policy if policy is not None else RetryPolicy()
        self._sleep = sleep

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` until the policy is satisfied; see :class:`RetryPolicy`."""
        call = start_call(self.policy, request)

        def attempt() -> httpx.Response:
            response = self.transport.handle_request(request)
            if call.key is not None or call.wants_body(response.status_code):
                # Read whole here, so a connection lost mid-body is retried with the same key.
                try:
                    response.read()
                except BaseException:
                    response.close()
                    raise
            return response

        response = send_with_retries(
            call, attempt, errors=httpx.TransportError, classify=classify, sleep=self._sleep
        )
        return annotate(call, response)

    def close(self) -> None:
        """Close the wrapped transport."""
        self.transport.close()
