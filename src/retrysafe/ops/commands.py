"""The operator commands, once for every front: ``retrysafe purge|check|inspect|resolve|schema|
stats``, Flask's ``flask retrysafe ...`` and Django's ``manage.py retrysafe_...`` all call these.

A command takes an open store and returns a :class:`Report`: the lines to show and the exit
status; each front only parses its own arguments and prints. A store that cannot be opened or
used is an :class:`OperatorError`, one line (a front shows it as ``retrysafe: <line>`` and exits
with status 2, or raises its framework's command error).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .._core.errors import IdempotencyError
from ..stores import Store, store_from_url
from . import records
from .stats import store_stats

__all__ = [
    "CHECK_WRITES",
    "OperatorError",
    "Report",
    "check",
    "inspect",
    "open_store",
    "purge",
    "reach",
    "resolve",
    "schema_apply",
    "stats",
    "store_kind",
]

#: What :func:`check` writes, said in the commands' help and in its output line.
CHECK_WRITES = (
    "reserves a probe key and releases it again, so nothing stays behind but the records "
    "table, which a SQL store creates if it is missing (as the app's first request would)"
)

#: The extra that brings a store driver, for a store that imports its driver on first use.
_DRIVER_EXTRAS = {
    "psycopg": "postgres",
    "psycopg_pool": "postgres",
    "pymysql": "mysql",
    "asyncmy": "mysql",
    "redis": "redis",
}
_PROBE_KEY = "retrysafe-cli-probe"


class OperatorError(Exception):
    """A store could not be opened or used; ``str()`` is the one line to show."""


@dataclass(frozen=True, slots=True)
class Report:
    """What a command has to say.

    Attributes:
        lines: the lines to show.
        code: the exit status (0 done; 1 the answer is "no": no record, nothing deleted, a
            check that failed, outcomes unknown with ``fail_on_unknown``).
        error: the lines are an error message (shown on stderr).
    """

    lines: tuple[str, ...]
    code: int = 0
    error: bool = False

    @property
    def text(self) -> str:
        """The lines, one per line."""
        return "\n".join(self.lines)


def store_kind(url: str) -> str:
    """The kind of store a URL names, as the commands show it (``sqlite``, ``redis``...)."""
    return url.split("://")[0]


def reach(operation: Callable[..., object], *args: object) -> None:
    """Run one store operation; a store error becomes the command's one-line failure.

    Raises:
        OperatorError: the store failed, or a driver it imports on first use is missing.
    """
    try:
        operation(*args)
    except IdempotencyError as exc:
        raise OperatorError(f"cannot use the store: {exc}") from exc
    except ImportError as exc:  # a driver imported on first use is not installed
        extra = _DRIVER_EXTRAS.get((exc.name or "").partition(".")[0])
        hint = f": pip install 'retrysafe[{extra}]'" if extra else ""
        raise OperatorError(f"cannot use the store, a driver is missing ({exc}){hint}") from exc


@contextlib.contextmanager
def open_store(url: str, *, probe: bool = True) -> Iterator[Store]:
    """Build the store a URL names and make one round trip to it, closing it afterwards.

    The round trip (a read of a key nobody uses) is what tells an unreachable server, a Redis
    database that does not exist or a SQLite path that cannot be opened from a working store,
    whichever command runs next. ``probe=False`` leaves it to the command (:func:`schema_apply`,
    whose table may not exist yet).

    Raises:
        OperatorError: the URL is invalid or the store cannot be reached or used.
    """
    try:
        store = store_from_url(url)
    except (IdempotencyError, ValueError) as exc:
        raise OperatorError(f"invalid store URL: {exc}") from exc
    try:
        if probe:
            reach(store.get, _PROBE_KEY)
        yield store
    finally:
        with contextlib.suppress(Exception):  # closing a store that never connected may fail
            store.close()


def purge(store: Store, *, dry_run: bool = False) -> Report:
    """Delete the expired records (``dry_run``: only count them)."""
    if not dry_run:
        return Report((f"purged {store.purge_expired()} expired records",))
    expired = store_stats(store).expired
    if getattr(store, "expires_records", False):
        return Report(("would purge 0 expired records (the store expires records by itself)",))
    return Report((f"would purge {expired} expired records (dry run: nothing deleted)",))


def check(store: Store, *, kind: str) -> Report:
    """Reserve a probe key and release it again (see :data:`CHECK_WRITES`).

    Args:
        store: the store.
        kind: what the output calls it (:func:`store_kind` of its URL).
    """
    probe = "retrysafe-check:" + os.urandom(8).hex()
    reservation = store.reserve(probe, "check", lease=5.0, ttl=10.0)
    if reservation.token is None or not store.release(probe, reservation.token):
        return Report(("store answered, but a reserve/release round trip failed",), 1, True)
    return Report(
        (
            f"ok: {kind} store reachable; a probe key was reserved and released (its records "
            "table exists: created now if it was missing)",
        )
    )


def schema_apply(store: Store, *, kind: str) -> Report:
    """Create the store's tables (a store without tables, Redis, is only reached).

    Raises:
        OperatorError: the store could not be reached or the tables not created.
    """
    ensure = getattr(store, "ensure_schema", None)
    if ensure is not None:
        reach(ensure)
    else:
        reach(store.get, _PROBE_KEY)
    return Report((f"schema ready in {kind} store",))


def inspect(store: Store, rid: str, *, function: str | None = None) -> Report:
    """Show the record of one key (:func:`~retrysafe.ops.records.describe`); status 1 when
    there is none."""
    record = store.get(rid)
    return Report(tuple(records.describe(rid, record, function=function)), int(record is None))


def resolve(store: Store, rid: str, *, force: bool, call: bool = False) -> Report:
    """Delete the record of one key (:func:`~retrysafe.ops.records.resolve`); status 1 when
    nothing was deleted."""
    deleted, message = records.resolve(store, rid, force=force, call=call)
    return Report((message,), int(not deleted))


def stats(
    store: Store, *, kind: str, ttl: float, as_json: bool = False, fail_on_unknown: bool = False
) -> Report:
    """Count the records by state (:func:`~retrysafe.ops.stats.store_stats`).

    Args:
        store: the store.
        kind: what the output calls it (:func:`store_kind` of its URL).
        ttl: the retention the app uses, seconds: the age of the oldest record in progress is
            derived from it.
        as_json: one JSON object instead of text.
        fail_on_unknown: status 1 when some key's outcome is unknown (a monitoring check).
    """
    counted = store_stats(store)
    left = counted.oldest_in_progress_retention_left
    oldest = None if left is None else max(0.0, ttl - left)
    code = int(fail_on_unknown and counted.outcome_unknown > 0)
    if as_json:
        shown = {**counted.as_dict(), "oldest_in_progress_age": oldest}
        return Report((json.dumps(shown, sort_keys=True),), code)
    unknown = counted.outcome_unknown
    lines = (
        f"store: {kind}",
        f"completed: {counted.completed}",
        f"in progress: {counted.in_progress + counted.committed} ({counted.committed} with "
        "effects committed)",
        "oldest in progress: none"
        if oldest is None
        else f"oldest in progress: started {oldest:.0f} s ago (for --ttl {ttl:g})",
        f"outcome unknown: {unknown}" + (" (retrysafe inspect / resolve)" if unknown else ""),
        f"lease lapsed (taken over on retry): {counted.lapsed}",
        f"expired (retrysafe purge deletes them): {counted.expired}",
    )
    return Report(lines, code)
