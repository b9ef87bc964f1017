"""retrysafe.client: retries that are safe by construction, and keys that survive a crash.

- :class:`RetryPolicy` decides, sans-I/O, when a request is sent again; one policy drives
  :class:`RetryingTransport` and :class:`AsyncRetryingTransport` (httpx, ``retrysafe[httpx]``)
  and :class:`RetryingAdapter` (requests, ``retrysafe[requests]``).
- :class:`SQLiteJournal` binds a key to an operation id durably before the first send, so a
  restarted process resumes with the same key and the server replays instead of running again.

The transports load on first use, so ``import retrysafe.client`` needs neither httpx nor
requests; a missing one is an ``ImportError`` naming the extra to install.
"""

from __future__ import annotations

import importlib
import typing

from ._errors import ClientError, KeyReusedError, OutcomeUnknownError, RetriesExhaustedError
from ._journal import Journal, JournalEntry, Operation, SQLiteJournal, current_operation
from ._policy import (
    IDEMPOTENT_METHODS,
    Decision,
    Failure,
    RetryCall,
    RetryInfo,
    RetryPolicy,
    parse_retry_after,
    retry_info,
)

if typing.TYPE_CHECKING:
    from ._async.transport import AsyncRetryingTransport
    from ._requests import RetryingAdapter
    from ._sync.transport import RetryingTransport

__all__ = [
    "IDEMPOTENT_METHODS",
    "AsyncRetryingTransport",
    "ClientError",
    "Decision",
    "Failure",
    "Journal",
    "JournalEntry",
    "KeyReusedError",
    "Operation",
    "OutcomeUnknownError",
    "RetriesExhaustedError",
    "RetryCall",
    "RetryInfo",
    "RetryPolicy",
    "RetryingAdapter",
    "RetryingTransport",
    "SQLiteJournal",
    "current_operation",
    "parse_retry_after",
    "retry_info",
]

# name -> (module, the library it needs, the extra that installs it)
_LAZY = {
    "AsyncRetryingTransport": ("._async.transport", "httpx", "httpx"),
    "RetryingTransport": ("._sync.transport", "httpx", "httpx"),
    "RetryingAdapter": ("._requests", "requests", "requests"),
}


def __getattr__(name: str) -> typing.Any:
    # PEP 562: the transports import their HTTP library only when first asked for.
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, library, extra = _LAZY[name]
    try:
        value = getattr(importlib.import_module(module, __name__), name)
    except ImportError as exc:
        if exc.name not in (library, None) and not (exc.name or "").startswith(library + "."):
            raise
        raise ImportError(
            f"retrysafe.client.{name} needs {library}: pip install 'retrysafe[{extra}]'",
            name=library,
        ) from exc
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
