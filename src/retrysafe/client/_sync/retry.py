# Generated from src/retrysafe/client/_async/retry.py by scripts/unasync.py: do not edit.
"""The sync retry loop: sends, asks the :class:`RetryCall` what to do, sleeps, sends again.

This file is generated from ``_async/retry.py`` by ``scripts/unasync.py``
(``make lint`` checks it): edit that file, then run the script. The sync loop
serves the httpx transport and the requests adapter alike; the library-specific parts (one
attempt, which exceptions are transport failures and what they mean) are passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

from .._policy import Failure, RetryCall

__all__ = ["Answer", "send_with_retries"]


class Answer(Protocol):
    """What the loop reads of a response (httpx's and requests' responses have it)."""

    @property
    def status_code(self) -> int: ...

    @property
    def content(self) -> bytes: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    def close(self) -> None: ...


AnswerT = TypeVar("AnswerT", bound=Answer)
ErrorT = TypeVar("ErrorT", bound=Exception)


def send_with_retries(
    call: RetryCall,
    attempt: Callable[[], AnswerT],
    *,
    errors: type[ErrorT],
    classify: Callable[[ErrorT], Failure],
    sleep: Callable[[float], object],
) -> AnswerT:
    """Send until ``call``'s policy returns the response or raises.

    Args:
        call: the call's policy state (key, attempts, deadline).
        attempt: sends once; reads the body when ``call`` needs it (a keyed call, or a status
            whose problem body decides).
        errors: the library's transport exception base class.
        classify: what such an exception means for a resend.
        sleep: waits between attempts.

    Returns:
        The response the policy accepts.

    Raises:
        ClientError: the policy's verdict (outcome unknown, key reused, retries exhausted).
    """
    while True:
        call.attempt()
        try:
            response = attempt()
        except errors as exc:
            decision = call.on_error(classify(exc), type(exc).__name__)
            if decision.action == "retry":
                sleep(decision.delay)
                continue
            if decision.error is not None:
                raise decision.error from exc
            raise
        status = response.status_code
        body = response.content if call.wants_body(status) else None
        headers = {name.lower(): value for name, value in response.headers.items()}
        decision = call.on_response(status, headers, body)
        if decision.action == "retry":
            response.close()
            sleep(decision.delay)
            continue
        if decision.error is not None:
            response.close()
            raise decision.error
        if decision.settled and call.operation is not None:
            call.operation.finish(status)
        return response
