"""The parts of OrderHub's HTTP contract (DESIGN section 5) that no framework needs: reading a
record from a request body, the demo knobs, the failure a handler raises on purpose. Each
framework's OrderHub (``app.py``, ``flask_app.py``, ``django_app``) only translates."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["DemoFailure", "InvalidRecord", "knob_ms", "parse_record"]

#: The longest ``?delay_ms=`` / ``?delay_after_ms=`` honoured (10 minutes).
_MAX_DELAY_MS = 600_000


class DemoFailure(Exception):
    """Raised by a handler asked to fail (``?fail=1``): nothing was written."""


class InvalidRecord(Exception):
    """A request body that is not a valid order or payment (answered as a problem).

    Attributes:
        status: ``400`` (not JSON) or ``422`` (not a valid record).
        title: the problem title.
        detail: what is wrong.
    """

    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.title = title
        self.detail = detail


def parse_record(body: bytes, kind: str, fields: dict[str, type]) -> dict[str, Any]:
    """The fields of an order or payment from a JSON body.

    Args:
        body: the request body.
        kind: ``"orders"`` or ``"payments"``.
        fields: each field's name and type (``{"item": str, "quantity": int}``).

    Raises:
        InvalidRecord: the body is not JSON, not an object, or a field is missing or mistyped.
    """
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise InvalidRecord(400, "Body is not JSON", "Send a JSON object.") from None
    if not isinstance(data, dict):
        raise InvalidRecord(422, "Invalid " + kind[:-1], "The body must be a JSON object.")
    values: dict[str, Any] = {}
    for name, typ in fields.items():
        value = data.get(name)
        if not isinstance(value, typ) or isinstance(value, bool):
            raise InvalidRecord(422, "Invalid " + kind[:-1], f"{name!r} must be {typ.__name__}.")
        values[name] = value
    return values


def knob_ms(raw: str | None) -> int:
    """A ``?delay_ms=`` style knob: milliseconds, 0 when absent or unreadable, at most 10 min."""
    try:
        return max(0, min(int(raw or "0"), _MAX_DELAY_MS))
    except ValueError:
        return 0
