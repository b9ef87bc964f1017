"""Exceptions raised by retrysafe.

The tree::

    IdempotencyError                 base: catch this to catch everything from retrysafe
    ├── ConfigurationError           bad settings, unknown store scheme, missing extra (start-up)
    ├── InvalidKeyError              the Idempotency-Key header is malformed
    ├── StoreError                   the store could not be reached or answered badly
    │   └── StoreUnavailableError    connection refused / timed out: retry later
    └── CodecError                   a stored record could not be decoded
"""

from __future__ import annotations

__all__ = [
    "CodecError",
    "ConfigurationError",
    "IdempotencyError",
    "InvalidKeyError",
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
