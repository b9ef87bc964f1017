"""Exceptions raised by the retrying client.

The tree (every class also derives from :class:`retrysafe.IdempotencyError`)::

    ClientError                  base: catch this to catch every client-side verdict
    ├── OutcomeUnknownError      409 idempotency-outcome-unknown: the server will not run the
    │                            request again and has no answer to replay; keep the key
    ├── KeyReusedError           422 idempotency-key-reused: the key went with another request
    └── RetriesExhaustedError    no answer after the last allowed attempt or at the deadline;
                                 the outcome is unknown to the client, resending with the same
                                 key later is safe
"""

from __future__ import annotations

from .._core.errors import IdempotencyError

__all__ = ["ClientError", "KeyReusedError", "OutcomeUnknownError", "RetriesExhaustedError"]


class ClientError(IdempotencyError):
    """Base class of the client's verdicts.

    Args:
        message: what happened.
        key: the Idempotency-Key of the call (``None`` when the request carried none).
        attempts: how many times the request was sent.
    """

    def __init__(self, message: str, *, key: str | None, attempts: int) -> None:
        super().__init__(message)
        self.key = key
        self.attempts = attempts


class OutcomeUnknownError(ClientError):
    """The server says the first request with this key committed its effects but its answer was
    never stored (the server crashed in between). It will not run again; an operator resolves
    the key (``retrysafe resolve``). Keep :attr:`key` to look the operation up.

    Args:
        message: what happened.
        key: the Idempotency-Key of the call.
        attempts: how many times the request was sent.
        detail: the problem's ``detail`` from the server, if any.
    """

    def __init__(self, message: str, *, key: str | None, attempts: int, detail: str = "") -> None:
        super().__init__(message, key=key, attempts=attempts)
        self.detail = detail


class KeyReusedError(ClientError):
    """The server has this key recorded for a different request (method, path, query or body):
    a programming error in the caller (one key must name one operation). Not retried."""


class RetriesExhaustedError(ClientError):
    """The request got no answer (connection errors, timeouts) within the allowed attempts or
    before the deadline. The server may or may not have run it; resending later with the same
    :attr:`key` is safe (the server replays or runs it once). The last transport error is the
    ``__cause__``.

    Args:
        message: what happened.
        key: the Idempotency-Key of the call.
        attempts: how many times the request was sent.
        reason: ``"max_attempts"`` or ``"deadline"``.
    """

    def __init__(self, message: str, *, key: str | None, attempts: int, reason: str) -> None:
        super().__init__(message, key=key, attempts=attempts)
        self.reason = reason
