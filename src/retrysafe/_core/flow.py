"""The request flow, sans-I/O: every row of the wire contract (DESIGN section 2) decided here.

Nothing in this module awaits, sleeps, spawns or talks to a server: it imports no asyncio, no
thread primitive and no framework. Shells build a :class:`~retrysafe._core.request.Request` and call
:func:`admit`; the request's :class:`Flow` then decides everything else. Its phases are
generators that **yield actions** (``(op, argument)`` pairs: reserve, complete, release, sleep,
emit...) and **return verdicts**; a runner (``_async/runner.py`` and its generated sync twin)
performs each action and sends the result back, or throws the exception the action raised (a
:class:`~retrysafe.StoreError`, a failing finalizer) into the generator, where the policy for it
lives. The same idiom runs the PostgreSQL store's operations, one level down.

Phases:

- :func:`admit`: pass-through, ``400`` missing or malformed key, ``413`` declared too large.
- :meth:`Flow.claim`: reserve, then replay, ``409`` in progress (or wait), ``422`` mismatch,
  ``409`` outcome unknown, ``503`` or fail-open when the store fails; or "execute".
- :meth:`Flow.settle`: the handler's response is final: status policy, fenced completion, the
  transactional commit, outcome unknown after committed effects, release, and the deferred
  completion after a store error (:meth:`Flow.complete_later`).
- :meth:`Flow.failed` / :meth:`Flow.incomplete`: the handler raised or never finished.
- :meth:`Flow.renew`, :meth:`Flow.mark_committed`: what runs beside the handler.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Generator, Mapping
from email.utils import formatdate
from typing import Any

from .codec import decode, encode
from .config import IdempotencyConfig
from .errors import CodecError, InvalidKeyError, StoreError
from .events import LOG_LEVELS, log_event
from .fingerprint import fingerprint
from .keys import parse_key, record_id
from .problems import render_problem
from .records import Reservation
from .request import Request
from .scope import default_principal

__all__ = [
    "BEGIN",
    "CLOCK",
    "COMPLETE",
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
    "TX_ROLLBACK",
    "TX_STATE",
    "Action",
    "Answer",
    "Capture",
    "Decision",
    "Estimates",
    "Flow",
    "admit",
    "decide",
    "notify",
    "problem",
    "retry_after",
    "too_large",
]

logger = logging.getLogger("retrysafe")

# -- actions: what a phase asks its runner to do ------------------------------------------------
# Each is yielded as ``(op, argument)``; the comment says the argument and what is sent back.

RESERVE = "reserve"  # None -> Reservation
COMPLETE = "complete"  # encoded response -> bool (False: fenced out)
RELEASE = "release"  # None -> bool
RENEW = "renew"  # None -> bool
MARK_COMMITTED = "mark_committed"  # lease seconds -> bool
BEGIN = "begin"  # None -> None: open (lazily) the request's transaction
TX_STATE = "tx_state"  # None -> (begun, broken)
TX_COMPLETE = "tx_complete"  # encoded response -> bool: write the record, commit both
TX_ROLLBACK = "tx_rollback"  # None -> None
TX_CLOSE = "tx_close"  # None -> None: give the connection back
FINALIZE = "finalize"  # ok -> None: run the handler's finalizers (may raise anything)
SLEEP = "sleep"  # seconds -> None
CLOCK = "clock"  # None -> monotonic seconds
NOW = "now"  # None -> wall-clock seconds since the epoch (only for the retention header)
EMIT = "emit"  # event name -> None: call the on_event hook
DEFER = "defer"  # encoded response -> None: keep the lease, run complete_later in the background

Action = tuple[str, Any]
Steps = Generator[Action, Any, Any]

#: Verdicts of :meth:`Flow.claim` besides an :class:`Answer`.
EXECUTE = "execute"
RUN_UNPROTECTED = "run_unprotected"

#: How long a response whose completion failed is retried before giving up.
COMPLETION_RETRY_SECONDS = 120.0

_BODY_OMITTED = (b"idempotency-body-omitted", b"true")


class Estimates:
    """How long each route's requests take in this process: a running average per route, for
    the ``Retry-After`` of a ``409`` (``adaptive_retry_after``). Bounded: past ``limit`` routes it
    starts over, so paths with ids in them cannot grow it without end."""

    __slots__ = ("limit", "seconds")

    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self.seconds: dict[tuple[str, str], float] = {}

    def observe(self, route: tuple[str, str], seconds: float) -> None:
        """Fold one handler's duration into the route's average."""
        known = self.seconds.get(route)
        if known is None:
            if len(self.seconds) >= self.limit:
                self.seconds.clear()
            self.seconds[route] = seconds
        else:
            self.seconds[route] = known + 0.2 * (seconds - known)

    def get(self, route: tuple[str, str]) -> float | None:
        """The route's average duration, if any request of it finished here."""
        return self.seconds.get(route)


class Answer:
    """A response the flow gives instead of the handler's: status, headers, body.

    Attributes:
        status: the HTTP status.
        headers: ``(lower-case name, value)`` byte pairs.
        body: the whole body.
        event: the event to report for an admission answer (shells emit it), else ``None``.
    """

    __slots__ = ("body", "event", "headers", "status")

    def __init__(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        event: str | None = None,
    ) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.event = event

    def __repr__(self) -> str:
        return f"<Answer {self.status}>"


class Capture:
    """The handler's response body as it will be stored: every chunk up to
    ``max_stored_body_size``; past it none (the record keeps status and headers, and its replay
    carries ``Idempotency-Body-Omitted: true``).

    Args:
        limit: ``max_stored_body_size``.
    """

    __slots__ = ("chunks", "limit", "omitted", "size")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[bytes] = []
        self.size = 0
        self.omitted = False

    def add(self, chunk: bytes) -> None:
        """Capture one body chunk."""
        if chunk and not self.omitted:
            self.size += len(chunk)
            if self.size > self.limit:
                self.omitted = True
                self.chunks.clear()
            else:
                self.chunks.append(chunk)

    @property
    def body(self) -> bytes:
        """The captured body (empty when omitted)."""
        chunks = self.chunks
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def problem(
    config: IdempotencyConfig,
    slug: str,
    detail: str,
    *,
    retry_after: int | None = None,
    event: str | None = None,
) -> Answer:
    """An RFC 9457 problem answer (see :mod:`retrysafe._core.problems`)."""
    status, headers, body = render_problem(
        slug,
        detail,
        type_base=config.problem_type_base,
        documentation_url=config.documentation_url,
        retry_after=retry_after,
    )
    return Answer(status, headers, body, event)


def too_large(config: IdempotencyConfig) -> Answer:
    """``413``: the body is over ``max_body_size`` (declared, or found while reading it)."""
    return problem(
        config,
        "idempotency-request-too-large",
        f"The request body exceeds {config.max_body_size} bytes.",
        event="too_large",
    )


def admit(request: Request, config: IdempotencyConfig) -> str | Answer | None:
    """Admission, before the body is read.

    Returns:
        ``None``: no key on a route where it is optional, run the handler unprotected; an
        :class:`Answer` to send at once (``400``, ``413``); else the parsed key.
    """
    if not request.keys:
        if config.required:
            return problem(
                config,
                "idempotency-key-missing",
                "This route requires an Idempotency-Key header.",
                event="missing_key",
            )
        return None
    try:
        key = parse_key(request.keys)
    except InvalidKeyError as exc:
        detail = exc.reason[:1].upper() + exc.reason[1:] + "."  # a sentence, as every detail
        return problem(config, "idempotency-key-invalid", detail, event="invalid_key")
    if request.content_length > config.max_body_size:
        return too_large(config)
    return key


def notify(
    config: IdempotencyConfig,
    event: str,
    request: Request,
    record: str,
    extra: Mapping[str, object] | None = None,
) -> None:
    """Report ``event``: one structured log line when it is non-trivial (see
    :mod:`retrysafe._core.events`), and the ``on_event`` hook (a failing hook is logged, never
    raised). Routine events cost nothing without a hook."""
    hook = config.on_event
    level = LOG_LEVELS.get(event)
    if hook is None and level is None:
        return
    details: dict[str, Any] = {
        "record": record[:16] or None,
        "path": request.path,
        "method": request.method,
        "route": request.route,
    }
    if extra:
        details.update((k, str(v) if k == "error" else v) for k, v in extra.items())
    if level is not None:
        log_event(event, details)
    if hook is not None:
        try:
            hook(event, details)
        except Exception:
            logger.exception("on_event hook failed")


class Decision(enum.Enum):
    """What a reservation outcome means for the request."""

    EXECUTE = "execute"
    """This request won the key: run the handler, then settle."""
    REPLAY = "replay"
    """A completed record for the same request: answer with the stored response."""
    IN_PROGRESS = "in_progress"
    """The first request is still running: 409 (or wait and replay)."""
    MISMATCH = "mismatch"
    """The key was used with a different request: 422, nothing runs."""
    OUTCOME_UNKNOWN = "outcome_unknown"
    """The first request committed its effects, then its process died before storing the
    response: 409 until an operator resolves the key or its retention ends, never a rerun."""


def decide(reservation: Reservation, fingerprint: str) -> Decision:
    """Map a reservation outcome to a decision.

    Args:
        reservation: what ``store.reserve`` returned.
        fingerprint: the fingerprint of the current request.

    Returns:
        The decision. A different request is a mismatch even while the first still runs, so a
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
    """Seconds a client should wait before retrying an in-progress key (at least 1)."""
    return max(1, math.ceil(lease_remaining))


class Flow:
    """One keyed request from its reservation to its settlement.

    Args:
        config: the request's settings (route overrides applied).
        request: the neutral request head.
        key: the parsed ``Idempotency-Key`` (from :func:`admit`).
        body: the whole request body.
    """

    __slots__ = (
        "added_headers",
        "committed",
        "config",
        "estimates",
        "fingerprint",
        "holds_response",
        "in_tx",
        "lease_lost",
        "record_id",
        "request",
        "token",
    )

    def __init__(self, config: IdempotencyConfig, request: Request, key: str, body: bytes) -> None:
        self.config = config
        self.request = request
        self.fingerprint = fingerprint(
            request.method,
            request.path,
            request.query,
            body,
            canonical_json=config.canonical_json,
            content_type=request.content_type,
        )
        resolver = config.scope_resolver
        if resolver is not None:
            principal = resolver(request)
        elif request.user is None and not request.authorization:
            principal = ""  # anonymous: global scope (the common case, without two calls)
        else:
            principal = default_principal(request)
        self.record_id = record_id(principal, request.method, request.path, key)
        #: The fencing token once the key is won ("" before).
        self.token = ""
        #: The handler declared its effects committed: never release from now on.
        self.committed = False
        #: A transaction object is open for this request (transactional mode).
        self.in_tx = False
        #: No byte of the response may leave before :meth:`settle` (transactional mode: the
        #: commit may still fail and turn the answer into a ``503``).
        self.holds_response = config.transactional
        #: A renewal found the lease taken over (reported then, not again at completion).
        self.lease_lost = False
        #: Headers the flow adds to the handler's response (and stores with it).
        self.added_headers: list[tuple[bytes, bytes]] = []
        #: The middleware's duration estimates (set by the runner), for ``Retry-After``.
        self.estimates: Estimates | None = None

    # -- claim -----------------------------------------------------------------------------

    def claim(self) -> Generator[Action, Any, str | Answer]:
        """Reserve the key and decide.

        Returns:
            :data:`EXECUTE` (run the handler; the token is held), :data:`RUN_UNPROTECTED`
            (fail-open after a store error), or the :class:`Answer` to send.
        """
        config = self.config
        deadline = -1.0
        delay = 0.01
        while True:
            try:
                reservation: Reservation = yield RESERVE, None
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
                if config.retention_header is not None:
                    now: float = yield NOW, None
                    expires = formatdate(now + config.ttl, usegmt=True).encode("ascii")
                    name = config.retention_header.lower().encode("ascii")
                    self.added_headers = [(name, expires)]
                if config.on_event is not None:
                    yield EMIT, "executed"
                return EXECUTE
            record = reservation.record
            assert record is not None
            if decision is Decision.REPLAY:
                assert record.response is not None
                return (yield from self._replay(record.response))
            if decision is Decision.MISMATCH:
                yield from self._emit("mismatch")
                return problem(
                    config,
                    "idempotency-key-reused",
                    "This Idempotency-Key was used with a different request "
                    "(method, path, query or body).",
                )
            if decision is Decision.OUTCOME_UNKNOWN:
                yield from self._emit("outcome_unknown")
                return problem(
                    config,
                    "idempotency-outcome-unknown",
                    "The first request with this Idempotency-Key committed its effects but its "
                    "response was never stored. It will not run again; an operator must resolve "
                    "the key (retrysafe resolve).",
                )
            if config.on_conflict == "wait":
                clock: float = yield CLOCK, None
                if deadline < 0:
                    deadline = clock + config.conflict_wait
                if clock + delay < deadline:
                    yield SLEEP, delay
                    delay = min(delay * 2, 0.25)
                    continue
            yield from self._emit("conflict")
            return problem(
                config,
                "idempotency-request-in-progress",
                "The first request with this Idempotency-Key is still being processed; "
                "retry later.",
                retry_after=retry_after(self._likely_remaining(record.lease_remaining)),
            )

    def _likely_remaining(self, lease_remaining: float) -> float:
        if self.config.adaptive_retry_after and self.estimates is not None:
            took = self.estimates.get((self.request.method, self.request.path))
            if took is not None:
                return min(lease_remaining, took)
        return lease_remaining

    def observe(self, seconds: float) -> None:
        """The handler took ``seconds`` (measured by the runner): fold it into the estimate."""
        if self.estimates is not None:
            self.estimates.observe((self.request.method, self.request.path), seconds)

    def _replay(self, data: bytes) -> Generator[Action, Any, Answer]:
        try:
            status, headers, body, omitted = decode(data)
        except CodecError as exc:
            return (
                yield from self.unavailable(
                    "The stored response cannot be read.", error=exc, phase="replay"
                )
            )
        if self.config.on_event is not None:
            yield EMIT, "replayed"
        if omitted:
            headers = [(n, v) for n, v in headers if n != b"content-length"]
            headers.append((b"content-length", b"0"))
            headers.append(_BODY_OMITTED)
        headers.extend(self.config._replayed_raw)
        return Answer(status, headers, body)

    # -- settlement ------------------------------------------------------------------------

    def settle(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...],
        body: bytes,
        omitted: bool,
    ) -> Generator[Action, Any, Answer | None]:
        """The handler's response is final (its last body chunk has not left yet).

        Args:
            status: the response status.
            headers: the response headers as byte pairs.
            body: the captured body (empty when ``omitted``).
            omitted: the body was over ``max_stored_body_size`` and is not stored.

        Returns:
            ``None``: send the handler's response; or an :class:`Answer` to send instead
            (only while :attr:`holds_response`: the transaction could not commit).
        """
        if self.in_tx:
            return (yield from self._settle_transaction(status, headers, body, omitted))
        yield from self._settle_plain(status, headers, body, omitted)
        return None

    def settle_plain(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...],
        body: bytes,
        omitted: bool,
    ) -> Generator[Action, Any, None]:
        """:meth:`settle` outside transactional mode (the hot path: one generator, no
        delegation); the runner calls it when :attr:`in_tx` is false."""
        return self._settle_plain(status, headers, body, omitted)

    def _settle_plain(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...],
        body: bytes,
        omitted: bool,
    ) -> Steps:
        if not self.config.should_store(status):
            if self.committed:
                # Effects committed, then a failure answer: neither a result to replay nor
                # safe to run again.
                yield from self._declare_unknown()
            else:
                yield from self._release()
            return
        data = self._encode(status, headers, body, omitted)
        try:
            done = yield COMPLETE, data
        except StoreError as exc:
            yield from self._emit("completion_deferred", error=exc)
            yield DEFER, data
            return
        if not done:
            yield from self._lease_lost_at_completion()

    def _settle_transaction(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...],
        body: bytes,
        omitted: bool,
    ) -> Generator[Action, Any, Answer | None]:
        storable = self.config.should_store(status)
        try:
            yield FINALIZE, storable
        except BaseException:
            # E.g. an ORM flush failing on a constraint: nothing commits, the key is freed.
            yield from self.abandon()
            raise
        begun, broken = yield TX_STATE, None
        if not storable:
            yield from self._rollback_and_close()
            if self.committed:  # an external effect was marked without the transaction
                yield from self._declare_unknown()
            else:
                yield from self._release()
            if broken:
                # The failure answer came from the transaction's connection dying under the
                # handler: say so (503, retry) rather than pass on the framework's 500.
                return (
                    yield from self.unavailable(
                        "The database connection was lost; retry with the same key.",
                        phase="transaction",
                    )
                )
            return None
        if not begun:  # the handler never asked for the connection: a plain completion
            yield from self._close_transaction()
            yield from self._settle_plain(status, headers, body, omitted)
            return None
        try:
            done = yield TX_COMPLETE, self._encode(status, headers, body, omitted)
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
            return problem(
                self.config,
                "idempotency-request-in-progress",
                "The lease of this request was taken over; its writes were rolled back. "
                "Retry later.",
                retry_after=retry_after(self.config.lease),
            )
        return None

    def failed(self, error: BaseException, started: bool) -> Generator[Action, Any, Answer | None]:
        """The handler raised before its response was settled.

        Args:
            error: what it raised.
            started: whether the response had started (its status is known).

        Returns:
            An :class:`Answer` to send instead of the error, or ``None``: re-raise it.
        """
        if not started and isinstance(error, StoreError):
            # The handler's transaction could not begin (lock, pool or connection): a store
            # failure like any other, answered 503, never a 500 with a traceback.
            yield from self.abandon()
            return (
                yield from self.unavailable(
                    "The idempotency store cannot be reached; retry later.",
                    error=error,
                    phase="handler",
                )
            )
        if not started and self.in_tx and isinstance(error, Exception):
            _, broken = yield TX_STATE, None
            if broken:
                # The handler failed because its transaction's connection died (e.g. a
                # terminated backend): a store failure, answered 503 like the others.
                yield from self.abandon()
                return (
                    yield from self.unavailable(
                        "The database connection was lost; retry with the same key.",
                        error=error,
                        phase="transaction",
                    )
                )
        yield from self.abandon()
        return None

    def incomplete(self) -> Steps:
        """The handler returned without finishing its response."""
        logger.warning("handler of %s returned without finishing its response", self.record_id[:12])
        yield from self.abandon()

    def abandon(self) -> Steps:
        """Nothing will be stored: free the key, unless effects are committed."""
        if self.in_tx:
            try:
                yield FINALIZE, False
            except Exception:
                logger.exception("a finalizer of %s failed", self.record_id[:12])
            # Give the connection back before releasing: with a pool as small as the number of
            # requests in flight, the release would otherwise wait for a connection.
            yield from self._rollback_and_close()
        if self.committed:
            yield from self._declare_unknown()
        else:
            yield from self._release()

    def finish(self) -> Steps | None:
        """The executed request is over, whatever happened: the steps that close its
        transaction if still open and report ``settled``; ``None`` when there are none."""
        if self.in_tx or self.config.on_event is not None:
            return self._finish()
        return None

    def _finish(self) -> Steps:
        yield from self._close_transaction()
        yield from self._emit("settled")

    def complete_later(self, data: bytes) -> Steps:
        """Keep trying to store a response after a store failure: while it is not stored the
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

    # -- beside the handler ----------------------------------------------------------------

    def renew(self) -> Generator[Action, Any, bool]:
        """Extend the lease. Returns ``False`` when it was taken over (stop renewing)."""
        try:
            ok = yield RENEW, None
        except StoreError as exc:
            logger.warning("could not renew the lease of %s: %s", self.record_id[:12], exc)
            return True  # the store may come back before the lease ends
        if not ok:
            self.lease_lost = True
            yield from self._emit("lease_lost", phase="renew")
        return bool(ok)

    def mark_committed(self) -> Generator[Action, Any, bool]:
        """See :func:`retrysafe.mark_committed`."""
        if self.in_tx:
            begun, _ = yield TX_STATE, None
            if begun:
                return True  # the effects commit with the record: nothing can fall in between
        # Whatever the store answers, the effect has happened: from now on this request never
        # releases its key (a failure ends in "outcome unknown", never in a rerun).
        self.committed = True
        try:
            return bool((yield MARK_COMMITTED, self.config.lease))
        except StoreError as exc:
            logger.error("could not mark %s committed: %s", self.record_id[:12], exc)
            return False

    def outcome_known(self) -> None:
        """The effect declared with :meth:`mark_committed` has a definite answer after all (the
        proxy's upstream replied in full): the response's status decides again, as if it had
        never been marked (stored, or released by the status policy)."""
        self.committed = False

    # -- shared steps ----------------------------------------------------------------------

    def unavailable(self, detail: str, **extra: object) -> Generator[Action, Any, Answer]:
        """``503`` + ``Retry-After``: the store (or the transaction's database) failed.

        Args:
            detail: the problem's detail.
            **extra: what the ``store_error`` event and its log line carry (``error``,
                ``phase``: where it failed).
        """
        yield from self._emit("store_error", **extra)
        return problem(
            self.config,
            "idempotency-store-unavailable",
            detail,
            retry_after=self.config.store_retry_after,
        )

    def _emit(self, event: str, **extra: object) -> Steps:
        # Only when someone listens: the hook, or the log for non-trivial events.
        if self.config.on_event is not None or event in LOG_LEVELS:
            yield EMIT, (event, extra) if extra else event

    def _release(self) -> Steps:
        try:
            yield RELEASE, None
        except StoreError as exc:
            # The lease lapses on its own; the key is free again after it.
            logger.error("could not release %s: %s", self.record_id[:12], exc)

    def _declare_unknown(self) -> Steps:
        """The effects are committed but there is no response to store: keep the key, and let
        its lease lapse now, so retries get "outcome unknown" at once, never a second run."""
        yield from self._emit("outcome_unknown", phase="declared")
        try:
            # mark_committed, not renew: it also lands if the handler's own mark never did.
            yield MARK_COMMITTED, 0.0
        except StoreError as exc:
            # The lease lapses on its own; the record stays committed either way.
            logger.error("could not end the lease of %s: %s", self.record_id[:12], exc)

    def _rollback_and_close(self) -> Steps:
        try:
            yield TX_ROLLBACK, None
        except StoreError as exc:
            logger.error("rollback of %s failed: %s", self.record_id[:12], exc)
        yield from self._close_transaction()

    def _close_transaction(self) -> Steps:
        if not self.in_tx:
            return
        self.in_tx = False
        try:
            yield TX_CLOSE, None
        except StoreError as exc:
            logger.error("closing the transaction of %s failed: %s", self.record_id[:12], exc)

    def _lease_lost_at_completion(self) -> Steps:
        # The response was not stored: another request took the key over (renewals failed for
        # longer than the lease) and may have run the operation again.
        if not self.lease_lost:
            self.lease_lost = True
            yield from self._emit("lease_lost", phase="completion")

    def _encode(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...],
        body: bytes,
        omitted: bool,
    ) -> bytes:
        config = self.config
        return encode(
            status,
            headers,
            body,
            omitted,
            deny=config._deny_raw,
            allow=config._allow_raw,
            added=self.added_headers,
        )
