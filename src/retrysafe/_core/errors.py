"""Exceptions raised by retrysafe.

The tree::

    IdempotencyError                 base: catch this to catch everything from retrysafe
    ├── ConfigurationError           bad settings, unknown store scheme, missing extra (start-up)
    ├── InvalidKeyError              the Idempotency-Key header (or a call's key) is malformed
    ├── ArgumentError                a call's argument cannot be fingerprinted (also a TypeError)
    ├── KeyReusedError               a call's key was used with different arguments
    ├── InProgressError              the first call with the key still runs (``retry_after``)
    ├── OutcomeUnknownError          the first call committed its effects, its result was lost
    ├── StoreError                   the store could not be reached or answered badly
    │   └── StoreUnavailableError    connection refused / timed out: retry later
    └── CodecError                   a stored record could not be decoded
"""

from __future__ import annotations

__all__ = [
    "ArgumentError",
    "CodecError",
    "ConfigurationError",
    "IdempotencyError",
    "InProgressError",
    "InvalidKeyError",
    "KeyReusedError",
    "OutcomeUnknownError",
    "StoreError",
    "StoreUnavailableError",
]


class IdempotencyError(Exception):
    """Base class of every exception retrysafe raises."""


class ConfigurationError(IdempotencyError):
    """Settings are invalid; raised at start-up, never per request.

    Args:
        message: what is wrong, naming the setting as the user wrote it and where.
        option: that setting as written at its source (``"ttl"``, ``"RETRYSAFE_TTL"``,
            ``"--ttl"``), when one setting is at fault.
    """

    def __init__(self, message: str, *, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


class InvalidKeyError(IdempotencyError):
    """The Idempotency-Key header value is not acceptable.

    Args:
        reason: a short, client-safe explanation (never contains the key itself).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ArgumentError(IdempotencyError, TypeError):
    """An argument of one call cannot be fingerprinted (JSON cannot hold it): raised at call
    time, before anything runs. A ``TypeError``, as Python's own for a bad argument; settings
    problems, found at decoration, are :class:`ConfigurationError`.

    Args:
        message: what is wrong and what to do (leave the argument out with ``fingerprint=``).
        argument: the parameter's name.
    """

    def __init__(self, message: str, *, argument: str) -> None:
        super().__init__(message)
        self.argument = argument


class _CallError(IdempotencyError):
    """A duplicate call that did not run; carries which function and record it was about."""

    def __init__(self, message: str, *, function: str = "", record: str = "") -> None:
        super().__init__(message)
        self.function = function
        self.record = record


class KeyReusedError(_CallError):
    """The key was used before with different arguments (a different fingerprint): nothing ran.

    The HTTP fronts answer the same situation with ``422 idempotency-key-reused``.

    Args:
        message: what happened.
        function: the name the call's keys are scoped by.
        record: a prefix of the record id (a hash; never the key).
    """


class InProgressError(_CallError):
    """The first call with this key is still running (its owner is alive): nothing ran.

    Retry after :attr:`retry_after` seconds, or decorate with ``on_conflict="wait"``.

    Args:
        message: what happened.
        retry_after: whole seconds after which a retry is likely to find the outcome.
        function: the name the call's keys are scoped by.
        record: a prefix of the record id.
    """

    def __init__(
        self, message: str, *, retry_after: int, function: str = "", record: str = ""
    ) -> None:
        super().__init__(message, function=function, record=record)
        self.retry_after = retry_after


class OutcomeUnknownError(_CallError):
    """The first call with this key committed its effects (``mark_committed``), then its process
    died before the result was stored. It never runs again: an operator checks what happened and
    resolves the key (``retrysafe resolve --function ... --key ...``), or its retention ends.

    Args:
        message: what happened.
        function: the name the call's keys are scoped by.
        record: a prefix of the record id.
    """


class StoreError(IdempotencyError):
    """The store failed to carry out an operation.

    Args:
        message: what failed.
        store: a short name of the store (``"sqlite"``, ``"redis"``...).
    """

    def __init__(self, message: str, *, store: str = "") -> None:
        super().__init__(message)
        self.store = store


class StoreUnavailableError(StoreError):
    """The store could not be reached (refused, timed out, closed); retrying later may work."""


class CodecError(IdempotencyError):
    """A stored response could not be decoded (corrupt or from an unknown format version)."""
