"""retrysafe: make non-idempotent HTTP requests (POST, PATCH) and function calls safe to retry.

A client sends one ``Idempotency-Key`` per logical operation; the server runs the operation once,
stores the response, and answers every retry with that stored response. A function decorated with
:func:`idempotent_function` runs once per key the same way, and returns the stored result to
every duplicate call.
"""

from __future__ import annotations

from ._core.codec import StoredResponse
from ._core.config import (
    DEFAULT_RELEASE_STATUSES,
    DEFAULT_REPLAY_HEADER_DENYLIST,
    IdempotencyConfig,
    RouteOptions,
)
from ._core.errors import (
    ArgumentError,
    CodecError,
    ConfigurationError,
    IdempotencyError,
    InProgressError,
    InvalidKeyError,
    KeyReusedError,
    OutcomeUnknownError,
    StoreError,
    StoreUnavailableError,
)
from ._core.request import Request
from ._core.routes import idempotent
from ._core.transaction import mark_committed, transaction
from .calls import CallOptions, Delivery, IdempotentFunction, idempotent_function
from .consumer import MessageHandler
from .stores import async_store_from_url, store_from_url

__version__ = "0.2.0"

__all__ = [
    "DEFAULT_RELEASE_STATUSES",
    "DEFAULT_REPLAY_HEADER_DENYLIST",
    "ArgumentError",
    "CallOptions",
    "CodecError",
    "ConfigurationError",
    "Delivery",
    "IdempotencyConfig",
    "IdempotencyError",
    "IdempotentFunction",
    "InProgressError",
    "InvalidKeyError",
    "KeyReusedError",
    "MessageHandler",
    "OutcomeUnknownError",
    "Request",
    "RouteOptions",
    "StoreError",
    "StoreUnavailableError",
    "StoredResponse",
    "async_store_from_url",
    "idempotent",
    "idempotent_function",
    "mark_committed",
    "store_from_url",
    "transaction",
]
