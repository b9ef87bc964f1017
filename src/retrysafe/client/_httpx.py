"""httpx transports that retry through the shared :class:`RetryPolicy` (needs ``retrysafe[httpx]``).

Both wrap any transport (``httpx.HTTPTransport()`` by default) and only translate: exceptions to
a :class:`Failure`, responses to status + headers (+ a problem body), decisions to sleeps. Bodies
given as bytes, text, JSON or a form are resent; iterator and multipart bodies cannot be replayed
reliably, so such a request is sent once (and a failure raises as without the transport).

The answer to a keyed call is read whole inside the transport, so a connection lost in the middle
of the body is retried with the same key (and replayed) rather than surfacing after the call has
ended; answers to calls without a key stream as usual.

This module holds what both transports share; :class:`AsyncRetryingTransport` is written in
``_async/transport.py`` and :class:`RetryingTransport` generated from it (``_sync/transport.py``).
"""

from __future__ import annotations

import httpx

from ._journal import current_operation
from ._policy import Failure, RetryCall, RetryPolicy

__all__ = ["annotate", "classify", "start_call"]

_KEY_HEADER = "Idempotency-Key"


def classify(exc: httpx.TransportError) -> Failure:
    """Map an httpx transport exception to what it means for a resend."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return Failure.NOT_SENT
    if isinstance(exc, httpx.NetworkError | httpx.TimeoutException | httpx.RemoteProtocolError):
        # RemoteProtocolError is also "server disconnected without sending a response".
        return Failure.LOST
    return Failure.FATAL


def start_call(policy: RetryPolicy, request: httpx.Request) -> RetryCall:
    """Start the policy's call for ``request`` and give the request its key header."""
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


def annotate(call: RetryCall, response: httpx.Response) -> httpx.Response:
    """Attach the call's :class:`RetryInfo` for :func:`retry_info`."""
    response.extensions["retrysafe"] = call.info()
    return response
