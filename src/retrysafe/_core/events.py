"""One structured log line per non-trivial outcome, on the ``retrysafe`` logger.

Each line reads ``<message> event=<event> record=<hashed prefix> method=... route=... path=...``
(logfmt after the message, so it greps and parses), and carries the same fields as a dict in
``record.retrysafe`` for JSON formatters. Keys are never logged: ``record`` is a prefix of the
record id, a hash of (scope, method, path, key). A function call's line reads ``kind=call
function=<name>`` instead of the method, route and path, and its message speaks of arguments and
results.

=======================  ========  ==============================================================
event                    level     when
=======================  ========  ==============================================================
``mismatch``             WARNING   a key was reused with a different request (``422``)
``fail_open``            WARNING   the store failed and the request ran unprotected
``store_error``          ERROR     the store failed and the request was answered ``503``
``outcome_unknown``      ERROR     effects committed without a stored response (``409``)
``lease_lost``           ERROR     another request took the key over while this one ran
``completion_deferred``  WARNING   storing the response failed; retried in the background
``completion_recovered`` INFO      a deferred response was stored
``completion_failed``    ERROR     a deferred response could not be stored in time
=======================  ========  ==============================================================

Every other event (``executed``, ``replayed``, ``conflict``...) is routine and not logged; count
it with ``on_event`` (e.g. :mod:`retrysafe.contrib.prometheus`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

__all__ = ["LOG_LEVELS", "log_event", "logger"]

logger = logging.getLogger("retrysafe")

#: The level of each logged event; events not listed are not logged.
LOG_LEVELS: dict[str, int] = {
    "mismatch": logging.WARNING,
    "fail_open": logging.WARNING,
    "store_error": logging.ERROR,
    "outcome_unknown": logging.ERROR,
    "lease_lost": logging.ERROR,
    "completion_deferred": logging.WARNING,
    "completion_recovered": logging.INFO,
    "completion_failed": logging.ERROR,
}

_MESSAGES: dict[str, str] = {
    "mismatch": "Idempotency-Key reused with a different request",
    "fail_open": "idempotency store failed, running unprotected",
    "store_error": "idempotency store failed, answering 503",
    "outcome_unknown": "outcome unknown: effects committed, response never stored",
    "lease_lost": "lease taken over by another request",
    "completion_deferred": "could not store the response; retrying in the background",
    "completion_recovered": "response stored after a retry",
    "completion_failed": "gave up storing the response",
}

#: The same events of a function call (``kind=call``), in its words.
_CALL_MESSAGES: dict[str, str] = {
    **_MESSAGES,
    "mismatch": "idempotency key reused with different arguments",
    "store_error": "idempotency store failed, the call did not run",
    "outcome_unknown": "outcome unknown: effects committed, result never stored",
    "lease_lost": "lease taken over by another caller",
    "completion_deferred": "could not store the result; retrying in the background",
    "completion_recovered": "result stored after a retry",
    "completion_failed": "gave up storing the result",
}

# Logged in this order; anything else in the details (e.g. a raw key) is never logged.
_FIELDS = ("record", "kind", "function", "method", "route", "path", "phase", "error")


def _value(value: object) -> str:
    text = str(value)
    if not text or any(c in text for c in ' "=\n\r\t'):
        # Quoted (logfmt), with control characters escaped so one event stays one line.
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


def log_event(event: str, details: Mapping[str, Any], message: str | None = None) -> None:
    """Log ``event`` at its level (see the table above); routine events are ignored.

    Args:
        event: the event name (as given to ``on_event``).
        details: the event's details; only ``record``, ``kind``, ``function``, ``method``,
            ``route``, ``path``, ``phase`` and ``error`` are logged.
        message: what happened, in words (default: a fixed text per event).
    """
    level = LOG_LEVELS.get(event)
    if level is None or not logger.isEnabledFor(level):
        return
    fields: dict[str, Any] = {"event": event}
    for name in _FIELDS:
        value = details.get(name)
        if value is not None:
            fields[name] = value
    text = " ".join(f"{name}={_value(value)}" for name, value in fields.items())
    if message is None:
        message = (_CALL_MESSAGES if fields.get("kind") == "call" else _MESSAGES)[event]
    logger.log(level, "%s %s", message, text, extra={"retrysafe": dict(fields)})
