"""The keyed operation, sans-I/O: what an HTTP request and a function call share (DESIGN
sections 3, 4 and 6).

One operation is one key: it is claimed (a single atomic reservation), its work runs while the
lease is renewed, and it is settled (the outcome stored, fenced by the reservation's token), or it
fails (the key is freed), or its effects are declared committed and it ends in "outcome unknown"
rather than run twice. In transactional mode the outcome commits in the same database
transaction as the work's own writes.

Nothing here awaits, sleeps, spawns or talks to a server: phases are generators that **yield
actions** (``(op, argument)`` pairs: reserve, complete, release, sleep, emit...) and **return
verdicts**; a runner (``_async/runner.py`` and its generated sync twin) performs each action and
sends the result back, or throws what performing it raised into the generator, where the policy
for it lives.

:class:`Operation` holds that shared policy. What an answer *is* belongs to a layer: the HTTP
flow (:mod:`retrysafe._core.http`) answers with a status and a problem document, a call
(:mod:`retrysafe._core.call`) returns the stored result or raises. A layer subclasses
:class:`Operation` and gives its verdicts through the hooks :meth:`~Operation.replay`,
:meth:`~Operation.reused`, :meth:`~Operation.unknown`, :meth:`~Operation.in_progress`,
:meth:`~Operation.fenced` and :meth:`~Operation.unavailable`, and its event details through
:meth:`~Operation.details`.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Generator, Mapping
from typing import Any, Generic, TypeVar

from ._mypyc import mypyc_attr
from .config import IdempotencyConfig
from .errors import StoreError
from .events import LOG_LEVELS, log_event
from .records import Reservation

__all__ = [
    "BEGIN",
    "CLOCK",
    "COMPLETE",
    "COMPLETION_RETRY_SECONDS",
    "DEFER",
    "EMIT",
    "EXECUTE",
    "FINALIZE",
    "MARK_COMMITTED",
    "NOW",
    "RELEASE",
    "RENEW",
    "RESERVE",
    "RUN_UNPROTECTED",
    "SLEEP",
    "TX_CLOSE",
    "TX_COMPLETE",
    "TX_LOCKED",
    "TX_ROLLBACK",
    "TX_STATE",
    "Action",
    "Decision",
    "Estimates",
    "Operation",
    "Steps",
    "decide",
    "report",
    "retry_after",
]

logger = logging.getLogger("retrysafe")

# -- actions: what a phase asks its runner to do ------------------------------------------------
# Each is yielded as ``(op, argument)``; the comment says the argument and what is sent back.

RESERVE = "reserve"  # None -> Reservation
COMPLETE = "complete"  # encoded outcome -> bool (False: fenced out)
RELEASE = "release"  # None -> bool
RENEW = "renew"  # None -> bool
MARK_COMMITTED = "mark_committed"  # lease seconds -> bool
BEGIN = "begin"  # None -> None: open (lazily) the operation's transaction
TX_STATE = "tx_state"  # None -> (begun, broken)
TX_LOCKED = "tx_locked"  # None -> bool: the transaction holds the store's single write lock
TX_COMPLETE = "tx_complete"  # encoded outcome -> bool: write the record, commit both
TX_ROLLBACK = "tx_rollback"  # None -> None
TX_CLOSE = "tx_close"  # None -> None: give the connection back
FINALIZE = "finalize"  # ok -> None: run the work's finalizers (may raise anything)
SLEEP = "sleep"  # seconds -> None
CLOCK = "clock"  # None -> monotonic seconds
NOW = "now"  # None -> wall-clock seconds since the epoch
EMIT = "emit"  # event name, or (event, details) -> None: log it and call the on_event hook
DEFER = "defer"  # encoded outcome -> None: keep the lease, run complete_later in the background

Action = tuple[str, Any]
Steps = Generator[Action, Any, Any]

#: Verdicts of :meth:`Operation.claim` besides a layer's own.
EXECUTE = "execute"
RUN_UNPROTECTED = "run_unprotected"

#: How long an outcome whose completion failed is retried before giving up.
COMPLETION_RETRY_SECONDS = 120.0

#: What a layer answers with (an HTTP answer; a call's verdict string).
V = TypeVar("V")


class Estimates:
    """How long each kind of operation (an HTTP route, a function) takes in this process: a
    running average per kind, for the retry-after of an in-progress answer
    (``adaptive_retry_after``). Bounded: past ``limit`` kinds it starts over, so paths with ids in
    them cannot grow it without end."""

    __slots__ = ("limit", "seconds")

    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self.seconds: dict[tuple[str, str], float] = {}

    def observe(self, route: tuple[str, str], seconds: float) -> None:
        """Fold one run's duration into its kind's average."""
        known = self.seconds.get(route)
        if known is None:
            if len(self.seconds) >= self.limit:
                self.seconds.clear()
            self.seconds[route] = seconds
        else:
            self.seconds[route] = known + 0.2 * (seconds - known)

    def get(self, route: tuple[str, str]) -> float | None:
        """The kind's average duration, if any run of it finished here."""
        return self.seconds.get(route)


class Decision(enum.Enum):
    """What a reservation outcome means for the operation."""

    EXECUTE = "execute"
    """This operation won the key: run the work, then settle."""
    REPLAY = "replay"
    """A completed record for the same operation: answer with the stored outcome."""
    IN_PROGRESS = "in_progress"
    """The first operation is still running: in progress (or wait and replay)."""
    MISMATCH = "mismatch"
    """The key was used with a different request or different arguments: nothing runs."""
    OUTCOME_UNKNOWN = "outcome_unknown"
    """The first operation committed its effects, then its process died before storing the
    outcome: refused until an operator resolves the key or its retention ends, never a rerun."""


def decide(reservation: Reservation, fingerprint: str) -> Decision:
    """Map a reservation outcome to a decision.

    Args:
        reservation: what ``store.reserve`` returned.
        fingerprint: the fingerprint of the current operation.

    Returns:
        The decision. A different operation is a mismatch even while the first still runs, so a
        client bug surfaces at once rather than after a retry.
    """
    if reservation.token is not None:
        return Decision.EXECUTE
    record = reservation.record
    if record is None:  # pragma: no cover - a store contract violation
        raise ValueError("a reservation holds either a token or a record")
    if record.fingerprint != fingerprint:
        return Decision.MISMATCH
    if record.state == "completed":
        return Decision.REPLAY
    if record.committed and record.lease_remaining <= 0:
        return Decision.OUTCOME_UNKNOWN
    return Decision.IN_PROGRESS


def retry_after(lease_remaining: float) -> int:
    """Seconds a caller should wait before retrying an in-progress key (at least 1)."""
    return max(1, math.ceil(lease_remaining))


def report(
    config: IdempotencyConfig,
    event: str,
    details: dict[str, Any],
    extra: Mapping[str, object] | None = None,
) -> None:
    """Report ``event``: one structured log line when it is non-trivial (see
    :mod:`retrysafe._core.events`), and the ``on_event`` hook (a failing hook is logged, never
    raised).

    Args:
        config: the settings (``on_event``).
        event: the event name.
        details: what identifies the operation (a hashed record prefix, never the key); updated
            in place with ``extra``.
        extra: ``error``, ``phase``... where they apply.
    """
    if extra:
        details.update((k, str(v) if k == "error" else v) for k, v in extra.items())
    if event in LOG_LEVELS:
        log_event(event, details)
    hook = config.on_event
    if hook is not None:
        try:
            hook(event, details)
        except Exception:
            logger.exception("on_event hook failed")


# Layers outside the compiled build subclass it (Call, RpcFlow): a native class allows that only
# when it says so. Its native subclasses (Flow) lose nothing by it.
@mypyc_attr(allow_interpreted_subclasses=True)
class Operation(Generic[V]):
    """One keyed operation from its reservation to its settlement: the phases every layer shares.

    A layer subclasses it, computes the record id and fingerprint from what it protects, and
    gives its verdicts through the hooks (each documented below). Type parameter ``V``: what the
    layer answers with besides :data:`EXECUTE` and :data:`RUN_UNPROTECTED`.

    Args:
        config: the operation's settings.
        record_id: the store address of the scoped key
            (:func:`~retrysafe._core.keys.record_id`).
        fingerprint: what makes two operations with one key "the same operation".
    """

    __slots__ = (
        "committed",
        "config",
        "estimates",
        "fingerprint",
        "in_tx",
        "lease_lost",
        "record_id",
        "settling",
        "token",
    )

    def __init__(self, config: IdempotencyConfig, record_id: str, fingerprint: str) -> None:
        self.config = config
        self.record_id = record_id
        self.fingerprint = fingerprint
        #: The fencing token once the key is won ("" before).
        self.token = ""
        #: The work declared its effects committed: never release from now on.
        self.committed = False
        #: A transaction object is open for this operation (transactional mode).
        self.in_tx = False
        #: A renewal found the lease taken over (reported then, not again at completion).
        self.lease_lost = False
        #: The outcome is being stored or the key freed: from then on a renewal that finds the
        #: record no longer in progress has met this operation's own settlement.
        self.settling = False
        #: The runner's duration estimates (set by the runner), for the retry-after.
        self.estimates: Estimates | None = None

    # -- the layer's part --------------------------------------------------------------------

    def details(self) -> dict[str, Any]:
        """What identifies this operation in an event (a fresh dict; never the raw key)."""
        return {"record": self.record_id[:16] or None}

    def kind(self) -> tuple[str, str]:
        """The kind of operation whose durations are averaged together (:class:`Estimates`)."""
        return ("", "")

    def won(self) -> Steps | None:
        """The key is won: steps to take before the work runs, or ``None``."""
        return None

    def replay(self, data: bytes) -> Generator[Action, Any, V]:
        """A completed record for the same operation: its stored outcome, ``data``."""
        raise NotImplementedError  # pragma: no cover - every layer gives it

    def replay_now(self, data: bytes) -> V | None:
        """:meth:`replay`'s verdict when giving it takes no action (nothing to report, ``data``
        readable), else ``None`` (:meth:`replay` runs). For :meth:`decided`."""
        return None

    def reused(self) -> V:
        """The key holds a different operation (the ``mismatch`` event is already emitted)."""
        raise NotImplementedError  # pragma: no cover

    def unknown(self) -> V:
        """The first operation's outcome is unknown (``outcome_unknown`` is emitted)."""
        raise NotImplementedError  # pragma: no cover

    def in_progress(self, seconds: int) -> V:
        """The first operation still runs; ``seconds``: when to retry (``conflict`` emitted)."""
        raise NotImplementedError  # pragma: no cover

    def fenced(self) -> V:
        """The transactional commit was fenced out: the lease was taken over and the work's
        writes were rolled back (``lease_lost`` is emitted)."""
        raise NotImplementedError  # pragma: no cover

    def unavailable(self, detail: str, **extra: object) -> Generator[Action, Any, V]:
        """The store (or the transaction's database) failed.

        Args:
            detail: what failed, in words for the caller.
            **extra: what the ``store_error`` event and its log line carry (``error``,
                ``phase``: where it failed).
        """
        raise NotImplementedError  # pragma: no cover

    # -- claim -----------------------------------------------------------------------------

    def decided(self, reservation: Reservation) -> str | V | None:
        """:meth:`claim`'s verdict on the first reservation when reaching it takes no action
        (the common cases: the key is won and nothing runs before the work; a replay with
        nothing to report), else ``None``: drive ``claim(reservation)``. A plain call: the
        runner reserves, then asks this, with no generator on a keyed request's hot path."""
        token = reservation.token
        if token is not None:
            config = self.config
            if config.transactional or config.on_event is not None or self.won() is not None:
                return None
            self.token = token
            return EXECUTE
        record = reservation.record
        if (
            record is not None
            and record.fingerprint == self.fingerprint
            and record.state == "completed"
            and record.response is not None
        ):
            return self.replay_now(record.response)
        return None

    def claim(
        self, first: Reservation | BaseException | None = None
    ) -> Generator[Action, Any, str | V]:
        """Reserve the key and decide.

        Args:
            first: the first reservation's answer, or what it raised, when the runner made it
                (:meth:`decided`); ``None``: reserve here.

        Returns:
            :data:`EXECUTE` (run the work; the token is held), :data:`RUN_UNPROTECTED`
            (fail-open after a store error), or the layer's verdict.
        """
        config = self.config
        deadline = -1.0
        delay = 0.01
        while True:
            try:
                if first is None:
                    reservation: Reservation = yield RESERVE, None
                elif isinstance(first, BaseException):
                    raise first
                else:
                    reservation, first = first, None
            except StoreError as exc:
                if config.on_store_error == "fail_open":
                    yield from self._emit("fail_open", error=exc)
                    return RUN_UNPROTECTED
                return (
                    yield from self.unavailable(
                        "The idempotency store cannot be reached; retry later.",
                        error=exc,
                        phase="reserve",
                    )
                )
            decision = decide(reservation, self.fingerprint)
            if decision is Decision.EXECUTE:
                self.token = reservation.token or ""
                if config.transactional:
                    self.in_tx = True
                    yield BEGIN, None
                steps = self.won()
                if steps is not None:
                    yield from steps
                if config.on_event is not None:
                    yield EMIT, "executed"
                return EXECUTE
            record = reservation.record
            assert record is not None
            if decision is Decision.REPLAY:
                assert record.response is not None
                return (yield from self.replay(record.response))
            if decision is Decision.MISMATCH:
                yield from self._emit("mismatch")
                return self.reused()
            if decision is Decision.OUTCOME_UNKNOWN:
                yield from self._emit("outcome_unknown")
                return self.unknown()
            if config.on_conflict == "wait":
                clock: float = yield CLOCK, None
                if deadline < 0:
                    deadline = clock + config.conflict_wait
                if clock + delay < deadline:
                    yield SLEEP, delay
                    delay = min(delay * 2, 0.25)
                    continue
            yield from self._emit("conflict")
            return self.in_progress(retry_after(self._likely_remaining(record.lease_remaining)))

    def _likely_remaining(self, lease_remaining: float) -> float:
        if self.config.adaptive_retry_after and self.estimates is not None:
            took = self.estimates.get(self.kind())
            if took is not None:
                return min(lease_remaining, took)
        return lease_remaining

    def observe(self, seconds: float) -> None:
        """The work took ``seconds`` (measured by the runner): fold it into the estimate."""
        if self.estimates is not None:
            self.estimates.observe(self.kind(), seconds)

    # -- settlement ------------------------------------------------------------------------

    def settle_data(self, data: bytes | None) -> Generator[Action, Any, None]:
        """The outcome is final, outside a begun transaction: store ``data`` (fenced), or, when
        ``None`` (nothing to store), free the key, unless effects are committed."""
        if data is None:
            if self.committed:
                # Effects committed, then a failure: neither an outcome to replay nor safe to
                # run again.
                yield from self._declare_unknown()
            else:
                yield from self._release()
            return
        self.settling = True
        try:
            done = yield COMPLETE, data
        except StoreError as exc:
            done = exc
        if done is not True:
            yield from self.completed(data, done)

    def completed(self, data: bytes, result: object) -> Steps:
        """What follows a completion of ``data`` that did not answer ``True``: ``result`` is the
        store's answer (false: fenced out), or the :class:`StoreError` it raised (the completion
        goes on in the background). :meth:`settle_data` and the runner's own completion (the
        hot path, no generator when it answers ``True``) come here."""
        if isinstance(result, StoreError):
            yield from self._emit("completion_deferred", error=result)
            yield DEFER, data
        elif not result:
            yield from self._lease_lost_at_completion()

    def settle_transaction(self, data: bytes | None) -> Generator[Action, Any, V | None]:
        """The outcome is final in transactional mode: run the finalizers, then commit the work's
        writes together with ``data`` (or roll them back and free the key when ``None``).

        Args:
            data: the encoded outcome, or ``None`` when it is not stored.

        Returns:
            ``None`` when settled as asked; else the layer's verdict to give instead (the
            commit failed or was fenced out).
        """
        storable = data is not None
        try:
            yield FINALIZE, storable
        except BaseException as exc:
            # E.g. an ORM flush failing on a constraint: nothing commits, the key is freed.
            yield from self.abandon()
            raise exc  # by name: compiled, a bare raise after a yield can raise another one
        begun, broken = yield TX_STATE, None
        if data is None:
            yield from self._rollback_and_close()
            if self.committed:  # an external effect was marked without the transaction
                yield from self._declare_unknown()
            else:
                yield from self._release()
            if broken:
                # The failure came from the transaction's connection dying under the work: say
                # so (retry) rather than pass on the work's own failure.
                return (
                    yield from self.unavailable(
                        "The database connection was lost; retry with the same key.",
                        phase="transaction",
                    )
                )
            return None
        if not begun:  # the work never asked for the connection: a plain completion
            yield from self._close_transaction()
            yield from self.settle_data(data)
            return None
        self.settling = True
        try:
            done = yield TX_COMPLETE, data
        except StoreError as exc:
            # The commit may or may not have happened; both outcomes are consistent (the writes
            # and the record commit together), so the retry replays or runs afresh.
            yield from self._close_transaction()
            if self.committed:  # an effect outside the transaction happened: never rerun
                yield from self._declare_unknown()
            else:
                yield from self._release()  # a no-op if the commit did land (record complete)
            return (
                yield from self.unavailable(
                    "The transaction could not be committed; retry with the same key.",
                    error=exc,
                    phase="commit",
                )
            )
        yield from self._close_transaction()
        if not done:
            # Fenced out: our lease was taken over and the writes were rolled back.
            yield from self._emit("lease_lost", phase="commit")
            return self.fenced()
        return None

    def abandon(self) -> Steps:
        """Nothing will be stored: free the key, unless effects are committed."""
        if self.in_tx:
            try:
                yield FINALIZE, False
            except Exception:
                logger.exception("a finalizer of %s failed", self.record_id[:12])
            # Give the connection back before releasing: with a pool as small as the number of
            # operations in flight, the release would otherwise wait for a connection.
            yield from self._rollback_and_close()
        if self.committed:
            yield from self._declare_unknown()
        else:
            yield from self._release()

    def finish(self) -> Steps | None:
        """The executed operation is over, whatever happened: the steps that close its
        transaction if still open and report ``settled``; ``None`` when there are none."""
        if self.in_tx or self.config.on_event is not None:
            return self._finish()
        return None

    def _finish(self) -> Steps:
        yield from self._close_transaction()
        yield from self._emit("settled")

    def complete_later(self, data: bytes) -> Steps:
        """Keep trying to store an outcome after a store failure: while it is not stored the
        key stays reserved (or, once committed, "outcome unknown"), never free."""
        deadline = (yield CLOCK, None) + COMPLETION_RETRY_SECONDS
        delay = 0.05
        while (yield CLOCK, None) < deadline:
            yield SLEEP, delay
            delay = min(delay * 2, 2.0)
            try:
                done = yield COMPLETE, data
            except StoreError:
                continue
            if done:
                yield from self._emit("completion_recovered")
            else:
                yield from self._lease_lost_at_completion()
            return
        yield from self._emit("completion_failed")

    # -- beside the work -------------------------------------------------------------------

    def renew(self) -> Generator[Action, Any, bool]:
        """Extend the lease. Returns ``False`` when it was taken over or the operation has
        settled (stop renewing)."""
        if self.in_tx and (yield TX_LOCKED, None):
            # The operation's own transaction holds the database's single write lock (SQLite):
            # no other operation can take the key over before it commits (with the outcome) or
            # rolls back, and a renewal, itself a write, would only queue behind it.
            return True
        try:
            ok = yield RENEW, None
        except StoreError as exc:
            logger.warning("could not renew the lease of %s: %s", self.record_id[:12], exc)
            return True  # the store may come back before the lease ends
        if not ok:
            if self.settling:
                # The record is no longer in progress because this operation stored its
                # outcome or freed the key while the renewal ran: not a loss. A real takeover
                # fences the completion out, and the completion reports it.
                return False
            self.lease_lost = True
            yield from self._emit("lease_lost", phase="renew")
        return bool(ok)

    def mark_committed(self) -> Generator[Action, Any, bool]:
        """See :func:`retrysafe.mark_committed`."""
        if self.in_tx:
            begun, _ = yield TX_STATE, None
            if begun:
                return True  # the effects commit with the record: nothing can fall in between
        # Whatever the store answers, the effect has happened: from now on this operation never
        # releases its key (a failure ends in "outcome unknown", never in a rerun).
        self.committed = True
        marked = yield from self._logged(
            MARK_COMMITTED, self.config.lease, "could not mark {} committed"
        )
        return bool(marked)

    def outcome_known(self) -> None:
        """The effect declared with :meth:`mark_committed` has a definite answer after all (the
        proxy's upstream replied in full): the outcome decides again, as if it had never been
        marked (stored, or released by the layer's policy)."""
        self.committed = False

    def notify(self, event: str, extra: Mapping[str, object] | None = None) -> None:
        """Report ``event`` for this operation (the runner's ``EMIT``): see :func:`report`.
        Routine events cost nothing without a hook."""
        if self.config.on_event is None and event not in LOG_LEVELS:
            return
        report(self.config, event, self.details(), extra)

    # -- shared steps ----------------------------------------------------------------------

    def _emit(self, event: str, **extra: object) -> Steps:
        # Only when someone listens: the hook, or the log for non-trivial events.
        if self.config.on_event is not None or event in LOG_LEVELS:
            yield EMIT, (event, extra) if extra else event

    def _logged(self, op: str, argument: Any, failure: str) -> Steps:
        """One store action whose failure is logged (``failure`` names it, ``{}`` the record)
        and not raised: what it would have done happens anyway (a lease lapses, a connection
        that failed is dropped). Returns the store's answer, ``None`` after a failure."""
        try:
            return (yield op, argument)
        except StoreError as exc:
            logger.error("%s: %s", failure.format(self.record_id[:12]), exc)
            return None

    def _release(self) -> Steps:
        self.settling = True
        # On failure the lease lapses on its own; the key is free again after it.
        yield from self._logged(RELEASE, None, "could not release {}")

    def _declare_unknown(self) -> Steps:
        """The effects are committed but there is no outcome to store: keep the key, and let
        its lease lapse now, so retries get "outcome unknown" at once, never a second run."""
        yield from self._emit("outcome_unknown", phase="declared")
        self.settling = True
        # mark_committed, not renew: it also lands if the work's own mark never did. On
        # failure the lease lapses on its own; the record stays committed either way.
        yield from self._logged(MARK_COMMITTED, 0.0, "could not end the lease of {}")

    def _rollback_and_close(self) -> Steps:
        yield from self._logged(TX_ROLLBACK, None, "rollback of {} failed")
        yield from self._close_transaction()

    def _close_transaction(self) -> Steps:
        if not self.in_tx:
            return
        self.in_tx = False
        yield from self._logged(TX_CLOSE, None, "closing the transaction of {} failed")

    def _lease_lost_at_completion(self) -> Steps:
        # The outcome was not stored: another operation took the key over (renewals failed for
        # longer than the lease) and may have run the work again.
        if not self.lease_lost:
            self.lease_lost = True
            yield from self._emit("lease_lost", phase="completion")
