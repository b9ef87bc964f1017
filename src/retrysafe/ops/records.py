"""One key's record, for operators: ``retrysafe inspect``/``resolve`` and the Django commands
``retrysafe_inspect``/``retrysafe_resolve`` name a record and say what it holds the same way.

A request's record is named by its key as the client sends the header (an sf-string
``'"k1"'`` or a bare token ``k1``), its method, path and scope; an idempotent function's call
by the function's name and the key it gave (calls have no method, path or principal).
"""

from __future__ import annotations

from .._core.errors import ConfigurationError
from .._core.keys import parse_key, record_id
from .._core.records import Record
from ..stores import Store

__all__ = ["describe", "resolve", "target_record_id"]


def target_record_id(
    key: str, *, path: str | None, function: str | None, method: str = "POST", scope: str = ""
) -> str:
    """The record id of one key.

    Args:
        key: the key as the client sent the ``Idempotency-Key`` header (a request), or as the
            function got it (a call).
        path: the request's path (a request's record), or ``None``.
        function: the name the function's keys are scoped by (a call's record), or ``None``.
        method: the request's method.
        scope: the request's scope (its principal); calls have none.

    Raises:
        ConfigurationError: neither or both of ``path`` and ``function``; a scope given for a
            call; a key that is no valid header value.
    """
    if (path is None) == (function is None):
        raise ConfigurationError("name either a request path or a function, not both")
    if function is not None:
        if scope:
            raise ConfigurationError(
                "a call's record has no scope: its key is the function's (drop --scope, "
                "--authorization or --user with --function)"
            )
        from .._core.call import call_record_id

        return call_record_id(function, key)
    assert path is not None
    parsed = parse_key([key.encode("utf-8", "surrogateescape")])
    return record_id(scope, method.upper(), path, parsed)


def describe(rid: str, record: Record | None, *, function: str | None = None) -> list[str]:
    """What an operator reads about a record: its state (outcome unknown said plainly), the
    lease left or what is stored. ``record`` ``None``: there is none."""
    if record is None:
        return [f"record {rid[:16]}: none (never used, released, or expired)"]
    state: str = record.state
    if state == "in_progress" and record.committed:
        state = "in_progress, effects committed"
        if record.lease_remaining <= 0:
            state = "OUTCOME UNKNOWN (effects committed, response never stored)"
    lines = [f"record {rid[:16]}: {state}"]
    if function is not None:
        lines.append(f"  kind: call, function: {function}")
    if record.state == "in_progress":
        lines.append(f"  lease remaining: {record.lease_remaining:.1f} s")
    elif record.response is not None and function is not None:
        from .._core.call import describe_outcome

        lines.append(f"  {describe_outcome(bytes(record.response))}")
    elif record.response is not None:
        from .._core.codec import decode_response

        stored = decode_response(record.response)
        lines.append(f"  status: {stored.status}, body: {len(stored.body)} bytes")
    return lines


def resolve(store: Store, rid: str, *, force: bool, call: bool = False) -> tuple[bool, str]:
    """Delete one record so the next request (or call) with its key runs the operation.

    A completed record is deleted only with ``force`` (its stored response is the answer every
    retry gets). Returns whether it was deleted and the sentence to show.
    """
    record = store.get(rid)
    if record is None:
        return False, f"record {rid[:16]}: none; nothing to resolve"
    if record.state == "completed" and not force:
        return False, f"record {rid[:16]} is completed; use --force to delete a stored response"
    store.delete(rid)
    what = "call" if call else "request"
    return True, f"record {rid[:16]} deleted: the next {what} with this key runs the operation"
