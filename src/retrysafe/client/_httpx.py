"""httpx transports that retry through the shared :class:`RetryPolicy` (needs ``retrysafe[httpx]``).

Both wrap any transport (``httpx.HTTPTransport()`` by default) and only translate: exceptions to
a :class:`Failure`, responses to status + headers (+ a problem body), decisions to sleeps. Bodies
given as bytes, text, JSON or a form are resent; iterator and multipart bodies cannot be replayed
reliably, so such a request is sent once (and a failure raises as without the transport).

The answer to a keyed call is read whole inside the transport, so a connection lost in the middle
of the body is retried with the same key (and replayed) rather than surfacing after the call has
ended; answers to calls without a key stream as usual.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import httpx

from ._journal import current_operation
from ._policy import Failure, RetryCall, RetryPolicy

__all__ = ["AsyncRetryingTransport", "RetryingTransport"]

_KEY_HEADER = "Idempotency-Key"


def classify(exc: httpx.TransportError) -> Failure:
    """Map an httpx transport exception to what it means for a resend."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return Failure.NOT_SENT
    if isinstance(exc, httpx.NetworkError | httpx.TimeoutException | httpx.RemoteProtocolError):
        # RemoteProtocolError is also "server disconnected without sending a response".
        return Failure.LOST
    return Failure.FATAL


def _start(policy: RetryPolicy, request: httpx.Request) -> RetryCall:
    call = policy.start(
        request.method,
        str(request.url),
        key_header=request.headers.get(_KEY_HEADER),
        replayable=isinstance(request.stream, httpx.ByteStream),
        operation=current_operation(),
    )
    if call.header_to_add is not None:
        request.headers[_KEY_HEADER] = call.header_to_add
    return call


def _headers(response: httpx.Response) -> dict[str, str]:
    return {name.lower(): value for name, value in response.headers.items()}


def _annotate(call: RetryCall, response: httpx.Response) -> httpx.Response:
    response.extensions["retrysafe"] = call.info()
    return response


class RetryingTransport(httpx.BaseTransport):
    """An httpx transport that adds idempotency keys and retries safely.

    Example::

        client = httpx.Client(transport=RetryingTransport())
        response = client.post("https://api.example/orders", json={...})
        retry_info(response)   # RetryInfo(key=..., attempts=2, replayed=True)

    Args:
        transport: the transport that sends (default ``httpx.HTTPTransport()``).
        policy: when to resend (default ``RetryPolicy()``).
        sleep: how to wait between attempts (injectable for tests).
    """

    def __init__(
        self,
        transport: httpx.BaseTransport | None = None,
        *,
        policy: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.transport = transport if transport is not None else httpx.HTTPTransport()
        self.policy = policy if policy is not None else RetryPolicy()
        self._sleep = sleep

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` until the policy is satisfied; see :class:`RetryPolicy`."""
        call = _start(self.policy, request)
        while True:
            call.attempt()
            try:
                response = self.transport.handle_request(request)
                if call.key is not None or call.wants_body(response.status_code):
                    try:
                        response.read()
                    except BaseException:
                        response.close()
                        raise
            except httpx.TransportError as exc:
                decision = call.on_error(classify(exc), type(exc).__name__)
                if decision.action == "retry":
                    self._sleep(decision.delay)
                    continue
                if decision.error is not None:
                    raise decision.error from exc
                raise
            body = response.content if call.wants_body(response.status_code) else None
            decision = call.on_response(response.status_code, _headers(response), body)
            if decision.action == "retry":
                response.close()
                self._sleep(decision.delay)
                continue
            if decision.error is not None:
                response.close()
                raise decision.error
            if decision.settled and call.operation is not None:
                call.operation.finish(response.status_code)
            return _annotate(call, response)

    def close(self) -> None:
        """Close the wrapped transport."""
        self.transport.close()


class AsyncRetryingTransport(httpx.AsyncBaseTransport):
    """The async twin of :class:`RetryingTransport` (same policy, same behaviour).

    Args:
        transport: the transport that sends (default ``httpx.AsyncHTTPTransport()``).
        policy: when to resend (default ``RetryPolicy()``).
        sleep: how to wait between attempts (default ``asyncio.sleep``; pass ``trio.sleep``
            under trio).
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
        call = _start(self.policy, request)
        while True:
            call.attempt()
            try:
                response = await self.transport.handle_async_request(request)
                if call.key is not None or call.wants_body(response.status_code):
                    try:
                        await response.aread()
                    except BaseException:
                        await response.aclose()
                        raise
            except httpx.TransportError as exc:
                decision = call.on_error(classify(exc), type(exc).__name__)
                if decision.action == "retry":
                    await self._sleep(decision.delay)
                    continue
                if decision.error is not None:
                    raise decision.error from exc
                raise
            body = response.content if call.wants_body(response.status_code) else None
            decision = call.on_response(response.status_code, _headers(response), body)
            if decision.action == "retry":
                await response.aclose()
                await self._sleep(decision.delay)
                continue
            if decision.error is not None:
                await response.aclose()
                raise decision.error
            if decision.settled and call.operation is not None:
                # A durable (fsynced) write: off the event loop.
                await asyncio.to_thread(call.operation.finish, response.status_code)
            return _annotate(call, response)

    async def aclose(self) -> None:
        """Close the wrapped transport."""
        await self.transport.aclose()
