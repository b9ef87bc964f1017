"""A requests adapter that retries through the shared :class:`RetryPolicy` (needs
``retrysafe[requests]``).

Mount it on a session; it replaces urllib3's own retries (``max_retries`` is always 0, so the two
never multiply). Bodies given as bytes, text, JSON or a form are resent; generator and file bodies
are sent once. Unless ``stream=True``, the body is read inside the adapter, so a connection that
dies mid-body is retried like one that dies before the head.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.exceptions import NewConnectionError

from .._core.errors import ConfigurationError
from ._journal import current_operation
from ._policy import Failure, RetryPolicy
from ._sync.retry import send_with_retries

__all__ = ["RetryingAdapter"]

_KEY_HEADER = "Idempotency-Key"


def classify(exc: requests.RequestException) -> Failure:
    """Map a requests exception to what it means for a resend."""
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return Failure.NOT_SENT
    if isinstance(exc, requests.exceptions.SSLError | requests.exceptions.ProxyError):
        return Failure.FATAL
    if isinstance(exc, requests.exceptions.ConnectionError):
        # Refused connections arrive as MaxRetryError(reason=NewConnectionError); anything else
        # (reset, "connection aborted", read timeout) happened after the request left.
        reason = getattr(exc.args[0], "reason", None) if exc.args else None
        if isinstance(reason, NewConnectionError):
            return Failure.NOT_SENT
        return Failure.LOST
    if isinstance(exc, requests.exceptions.Timeout | requests.exceptions.ChunkedEncodingError):
        return Failure.LOST
    return Failure.FATAL


class RetryingAdapter(HTTPAdapter):
    """A ``requests`` transport adapter that adds idempotency keys and retries safely.

    Example::

        session = requests.Session()
        adapter = RetryingAdapter()
        session.mount("https://", adapter)
        session.mount("http://", adapter)
        response = session.post("https://api.example/orders", json={...})
        retry_info(response)   # RetryInfo(key=..., attempts=2, replayed=True)

    Args:
        policy: when to resend (default ``RetryPolicy()``).
        sleep: how to wait between attempts (injectable for tests).
        **kwargs: ``pool_connections``, ``pool_maxsize``, ``pool_block`` of ``HTTPAdapter``.

    Raises:
        ConfigurationError: ``max_retries`` was given (the policy does the retrying).
    """

    def __init__(
        self,
        policy: RetryPolicy | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        **kwargs: Any,
    ) -> None:
        if "max_retries" in kwargs:
            raise ConfigurationError(
                "RetryingAdapter does its own retries: configure RetryPolicy, not max_retries"
            )
        self.policy = policy if policy is not None else RetryPolicy()
        self._sleep = sleep
        super().__init__(max_retries=0, **kwargs)

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: bool | str = True,
        cert: Any = None,
        proxies: Mapping[str, str] | None = None,
    ) -> requests.Response:
        """Send ``request`` until the policy is satisfied; see :class:`RetryPolicy`."""
        existing = request.headers.get(_KEY_HEADER)
        if isinstance(existing, bytes):
            existing = existing.decode("latin-1")
        call = self.policy.start(
            request.method or "GET",
            request.url or "",
            key_header=existing,
            replayable=request.body is None or isinstance(request.body, bytes | str),
            operation=current_operation(),
        )
        if call.header_to_add is not None:
            request.headers[_KEY_HEADER] = call.header_to_add

        def attempt() -> requests.Response:
            response = HTTPAdapter.send(
                self,
                request,
                stream=stream,
                timeout=timeout,
                verify=verify,
                cert=cert,
                proxies=dict(proxies) if proxies is not None else None,
            )
            if not stream or call.wants_body(response.status_code):
                response.content  # noqa: B018 - read now, so a mid-body failure is retried
            return response

        response = send_with_retries(
            call,
            attempt,
            errors=requests.RequestException,
            classify=classify,
            sleep=self._sleep,
        )
        # requests.Response has no extensions; retry_info() reads this attribute.
        response.retrysafe = call.info()  # type: ignore[attr-defined]
        return response
