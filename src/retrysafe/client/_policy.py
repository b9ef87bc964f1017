"""The retry policy, sans-I/O: one object decides for the httpx transports and the requests
adapter alike.

A shell asks :meth:`RetryPolicy.start` for a :class:`RetryCall` per request, sends, and feeds
back what came of each attempt (:meth:`RetryCall.on_response` with status, headers and, where
:meth:`RetryCall.wants_body` says so, the body; or :meth:`RetryCall.on_error` with the neutral
:class:`Failure` class of the transport exception). The answer is a :class:`Decision`: send again
after ``delay`` seconds, return the response, or raise. The policy never sleeps, never touches a
socket and imports no HTTP library, so every branch is tested by scripting attempts into it.
"""

from __future__ import annotations

import email.utils
import enum
import hashlib
import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit, urlunsplit

from .._core.errors import ConfigurationError, InvalidKeyError
from .._core.keys import parse_key
from ._errors import ClientError, KeyReusedError, OutcomeUnknownError, RetriesExhaustedError

if TYPE_CHECKING:
    from ._journal import Operation

__all__ = [
    "IDEMPOTENT_METHODS",
    "Decision",
    "Failure",
    "RetryCall",
    "RetryInfo",
    "RetryPolicy",
    "parse_retry_after",
    "retry_info",
]

#: Methods HTTP defines as idempotent (RFC 9110 section 9.2.2): resent without a key.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})

EventHook = Callable[[str, dict[str, object]], None]

_logger = logging.getLogger("retrysafe.client")
_IN_PROGRESS = "idempotency-request-in-progress"
_OUTCOME_UNKNOWN = "idempotency-outcome-unknown"
_KEY_REUSED = "idempotency-key-reused"
# A problem body larger than this is not a retrysafe problem; it is not parsed.
_MAX_PROBLEM_BODY = 16384


class Failure(enum.Enum):
    """What a transport exception means for a resend (the shells map their exceptions here)."""

    #: Nothing reached the server (connection refused, connect or pool timeout).
    NOT_SENT = "not_sent"
    #: The request may have reached the server but no complete answer came back (reset,
    #: disconnect, read or write timeout): the server may have run it.
    LOST = "lost"
    #: Not a network fault (bad URL, protocol misuse, TLS set-up): never retried.
    FATAL = "fatal"


@dataclass(frozen=True, slots=True)
class Decision:
    """What the shell does next.

    Attributes:
        action: ``"retry"`` (sleep ``delay`` s, send again), ``"return"`` (hand the response to
            the caller) or ``"raise"`` (raise ``error``, or re-raise the transport exception
            when ``error`` is ``None``).
        delay: seconds to wait before the next attempt (``"retry"`` only).
        error: the exception to raise (``"raise"`` only).
        reason: why, for events and logs (``"status_503"``, ``"lost"``, ``"deadline"``...).
        settled: the server gave a final answer for the key; an operation may be marked done.
    """

    action: Literal["retry", "return", "raise"]
    delay: float = 0.0
    error: ClientError | None = None
    reason: str = ""
    settled: bool = False


@dataclass(frozen=True, slots=True)
class RetryInfo:
    """What happened to one call; ``retry_info(response)`` returns it.

    Attributes:
        key: the Idempotency-Key the call carried (``None``: none).
        attempts: how many times the request was sent.
        replayed: the server answered with a stored response (``Idempotency-Replayed: true`` or
            Stripe's ``Idempotent-Replayed: true``), so this call did not run the operation.
        operation_id: the journal operation the key belongs to, if any.
    """

    key: str | None
    attempts: int
    replayed: bool
    operation_id: str | None = None


def retry_info(response: object) -> RetryInfo | None:
    """Return what a retrying transport or adapter recorded on its response.

    Args:
        response: an ``httpx.Response`` or ``requests.Response``.

    Returns:
        The :class:`RetryInfo`, or ``None`` when the response did not come through one.
    """
    extensions = getattr(response, "extensions", None)
    info = extensions.get("retrysafe") if isinstance(extensions, dict) else None
    if info is None:
        info = getattr(response, "retrysafe", None)
    return info if isinstance(info, RetryInfo) else None


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Return the delay a ``Retry-After`` value asks for, in seconds.

    Args:
        value: the header value: delay-seconds (``"3"``) or an HTTP-date
            (``"Wed, 21 Oct 2026 07:28:00 GMT"``).
        now: the current wall-clock time (Unix seconds), for the HTTP-date form.

    Returns:
        The non-negative delay, or ``None`` when the value is missing or malformed (the caller
        falls back to its own backoff).
    """
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(int(value))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        # RFC 9110 dates are GMT; a date without a zone is taken as such rather than as local.
        return None
    return max(0.0, when.timestamp() - now)


def _problem_slug(headers: Mapping[str, str], body: bytes | None) -> str | None:
    if not body or len(body) > _MAX_PROBLEM_BODY:
        return None
    if "json" not in headers.get("content-type", ""):
        return None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    kind = data.get("type") if isinstance(data, dict) else None
    if not isinstance(kind, str):
        return None
    # Any problem_type_base: the slug is the last part of the type ("urn:...:<slug>", ".../<slug>").
    for slug in (_IN_PROGRESS, _OUTCOME_UNKNOWN, _KEY_REUSED):
        if kind.endswith(slug):
            return slug
    return None


def _problem_detail(body: bytes | None) -> str:
    try:
        data = json.loads(body or b"")
    except (ValueError, RecursionError):
        return ""
    detail = data.get("detail") if isinstance(data, dict) else None
    return detail if isinstance(detail, str) else ""


def _safe_url(url: str) -> str:
    # Events and logs get the URL without query, fragment or userinfo (they may hold secrets).
    try:
        parts = urlsplit(url)
    except ValueError:
        return ""
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def _key_of(header_value: str) -> str:
    try:
        return parse_key([header_value.encode("latin-1")])
    except (InvalidKeyError, UnicodeEncodeError):
        # Used as given; the server answers 400 (not retried) if it is malformed.
        return header_value


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """When to send a request again, shared by every transport and adapter.

    POST and PATCH (``key_methods``) get an ``Idempotency-Key`` (a UUIDv4 sf-string) unless they
    carry one; the key stays the same on every attempt of the call, so the server runs the
    operation at most once. Retried: connection errors and timeouts, ``retry_statuses`` and
    ``409 idempotency-request-in-progress``, honouring ``Retry-After``, with capped exponential
    backoff and full jitter, within ``max_attempts`` and ``deadline``. Never retried: other
    4xx (a 400 or 422 needs a changed request), ``409 idempotency-outcome-unknown`` (raised as
    :class:`OutcomeUnknownError`), a request that could have reached the server but can not be
    resent safely (a POST without key, a streamed body).

    Args:
        max_attempts: the most times one call is sent (1 = never retry).
        deadline: seconds from the first attempt after which no new attempt starts.
        backoff_initial: the cap of the first retry's random delay, seconds.
        backoff_max: the cap of any retry's random delay, seconds.
        max_retry_after: a longer ``Retry-After`` is not waited for: the response is returned.
        retry_statuses: statuses resent (a gateway or the server could not answer).
        key_methods: methods that get a key and are resent only with one.
        idempotent_methods: methods resent without a key.
        add_keys: add a fresh key to ``key_methods`` requests without one.
        on_event: ``hook(event, details)`` for logs and metrics: ``"attempt"``, ``"retry"``,
            ``"give_up"``, ``"done"``. Details carry ``key_id`` (a short hash), never the raw
            key unless ``log_keys``.
        log_keys: add the raw ``key`` to event details and log lines.
        rng: the random source of the jitter (seed one for reproducible delays).
        clock: monotonic seconds, for the deadline.
        wall_clock: Unix seconds, for ``Retry-After`` HTTP-dates.

    Raises:
        ConfigurationError: a value out of range.
    """

    max_attempts: int = 5
    deadline: float = 30.0
    backoff_initial: float = 0.25
    backoff_max: float = 8.0
    max_retry_after: float = 60.0
    retry_statuses: frozenset[int] = frozenset({502, 503, 504})
    key_methods: frozenset[str] = frozenset({"POST", "PATCH"})
    idempotent_methods: frozenset[str] = IDEMPOTENT_METHODS
    add_keys: bool = True
    on_event: EventHook | None = None
    log_keys: bool = False
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)
    clock: Callable[[], float] = field(default=time.monotonic, compare=False, repr=False)
    wall_clock: Callable[[], float] = field(default=time.time, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError("max_attempts must be at least 1")
        for name in ("deadline", "backoff_initial", "backoff_max", "max_retry_after"):
            if getattr(self, name) < 0:
                raise ConfigurationError(f"{name} must not be negative")
        if self.backoff_initial > self.backoff_max:
            raise ConfigurationError("backoff_initial must not exceed backoff_max")
        if any(not 100 <= status <= 599 for status in self.retry_statuses):
            raise ConfigurationError("retry_statuses must be HTTP statuses (100-599)")
        # Upper-case once here so every comparison later is a plain set lookup.
        object.__setattr__(self, "key_methods", frozenset(m.upper() for m in self.key_methods))
        object.__setattr__(
            self, "idempotent_methods", frozenset(m.upper() for m in self.idempotent_methods)
        )

    def start(
        self,
        method: str,
        url: str = "",
        *,
        key_header: str | None = None,
        replayable: bool = True,
        operation: Operation | None = None,
    ) -> RetryCall:
        """Begin one call (all attempts of one request).

        Args:
            method: the request method.
            url: the request URL, for events (query, fragment and userinfo are left out).
            key_header: the request's ``Idempotency-Key`` value, if it has one (used as is).
            replayable: whether the body can be sent again (``False``: a streamed body).
            operation: the journal operation in force; its key is used when the request has
                none.

        Returns:
            The call's state; the shell sets :attr:`RetryCall.header_to_add`, if any, on the
            request before the first attempt.
        """
        return RetryCall(self, method.upper(), _safe_url(url), key_header, replayable, operation)

    def backoff(self, retry: int) -> float:
        """Return the random delay before retry number ``retry`` (1 for the first retry).

        Full jitter: uniform in ``[0, min(backoff_max, backoff_initial * 2 ** (retry - 1))]``, so
        many clients failing together spread out instead of retrying in lockstep.
        """
        cap = min(self.backoff_max, self.backoff_initial * 2.0 ** min(retry - 1, 62))
        return self.rng.uniform(0.0, cap)


class RetryCall:
    """The state of one call: its key, the attempts so far, the deadline.

    Created by :meth:`RetryPolicy.start`; the shell calls :meth:`attempt` before each send and
    then :meth:`on_response` or :meth:`on_error`.
    """

    def __init__(
        self,
        policy: RetryPolicy,
        method: str,
        url: str,
        key_header: str | None,
        replayable: bool,
        operation: Operation | None,
    ) -> None:
        self.policy = policy
        self.method = method
        self.url = url
        self.replayable = replayable
        self.operation = operation
        self.attempts = 0
        #: Whether the final response was a replay (set by :meth:`on_response`).
        self.replayed = False
        self._started = policy.clock()
        #: The header value the shell must set before the first attempt (``None``: nothing).
        self.header_to_add: str | None = None
        self.key: str | None
        if key_header is not None:
            self.key = _key_of(key_header)
        elif method in policy.key_methods and operation is not None:
            self.key = operation.key
            self.header_to_add = operation.header_value
        elif method in policy.key_methods and policy.add_keys:
            self.key = str(uuid.uuid4())
            self.header_to_add = f'"{self.key}"'
        else:
            self.key = None

    @property
    def resendable(self) -> bool:
        """Whether a request that may have reached the server can be sent again safely."""
        if not self.replayable:
            return False
        if self.method in self.policy.idempotent_methods:
            return True
        return self.method in self.policy.key_methods and self.key is not None

    def attempt(self) -> None:
        """Count an attempt; call it right before each send."""
        self.attempts += 1
        self._emit("attempt", attempt=self.attempts)

    def info(self) -> RetryInfo:
        """Return the summary of the call so far."""
        op_id = self.operation.id if self.operation is not None else None
        return RetryInfo(self.key, self.attempts, self.replayed, op_id)

    @staticmethod
    def wants_body(status: int) -> bool:
        """Whether :meth:`on_response` needs the body of a response with ``status``.

        Only ``409`` and ``422`` (a small problem document tells in-progress, outcome-unknown and
        key-reused apart); every other body stays unread, so streaming responses stream.
        """
        return status in (409, 422)

    def on_response(
        self, status: int, headers: Mapping[str, str], body: bytes | None = None
    ) -> Decision:
        """Decide after an attempt got a response.

        Args:
            status: the response status.
            headers: the response headers, names lower-case.
            body: the body when :meth:`wants_body` asked for it, else ``None``.

        Returns:
            The decision.
        """
        slug = _problem_slug(headers, body) if self.wants_body(status) else None
        if slug == _OUTCOME_UNKNOWN:
            return self._give_up(
                "outcome_unknown",
                OutcomeUnknownError(
                    "the server does not know whether the first request with this key "
                    "took effect; it will not run it again (an operator must resolve the key)",
                    key=self.key,
                    attempts=self.attempts,
                    detail=_problem_detail(body),
                ),
                status=status,
            )
        if slug == _KEY_REUSED:
            return self._give_up(
                "key_reused",
                KeyReusedError(
                    "the server holds this Idempotency-Key for a different request",
                    key=self.key,
                    attempts=self.attempts,
                ),
                status=status,
            )
        retryable = status in self.policy.retry_statuses or (status == 409 and slug == _IN_PROGRESS)
        if not retryable:
            self.replayed = _replayed(headers)
            self._emit("done", attempts=self.attempts, status=status, replayed=self.replayed)
            # 409/429 and 5xx leave the key open on the server; anything else is its answer.
            settled = status < 500 and status not in (409, 429)
            return Decision("return", reason=f"status_{status}", settled=settled)
        reason = f"status_{status}"
        # A 5xx before the handler finished may still have run it: resend only when safe.
        if status != 409 and not self.resendable:
            self._emit("give_up", attempts=self.attempts, reason="not_resendable", status=status)
            return Decision("return", reason="not_resendable")
        hint = parse_retry_after(headers.get("retry-after"), self.policy.wall_clock())
        if hint is not None and hint > self.policy.max_retry_after:
            self._emit("give_up", attempts=self.attempts, reason="retry_after_too_long")
            return Decision("return", reason="retry_after_too_long")
        delay = hint if hint is not None else self.policy.backoff(self.attempts)
        verdict = self._next(delay, reason)
        if verdict is not None:
            self._emit("give_up", attempts=self.attempts, reason=verdict, status=status)
            return Decision("return", reason=verdict)
        self._emit("retry", attempt=self.attempts, delay=delay, reason=reason, status=status)
        return Decision("retry", delay=delay, reason=reason)

    def on_error(self, failure: Failure, error_name: str = "") -> Decision:
        """Decide after an attempt raised a transport exception.

        Args:
            failure: the neutral class of the exception (the shell maps its library's).
            error_name: the exception's class name, for events.

        Returns:
            The decision; ``"raise"`` with ``error=None`` means re-raise the original.
        """
        reason = failure.value
        if failure is Failure.FATAL:
            self._emit("give_up", attempts=self.attempts, reason="fatal", error=error_name)
            return Decision("raise", reason="fatal")
        # Nothing was sent: a resend is safe for any method, as long as the body can be replayed.
        if not (self.resendable or (failure is Failure.NOT_SENT and self.replayable)):
            self._emit("give_up", attempts=self.attempts, reason="not_resendable", error=error_name)
            return Decision("raise", reason="not_resendable")
        delay = self.policy.backoff(self.attempts)
        verdict = self._next(delay, reason)
        if verdict is not None:
            self._emit("give_up", attempts=self.attempts, reason=verdict, error=error_name)
            return Decision(
                "raise",
                reason=verdict,
                error=RetriesExhaustedError(
                    f"no answer after {self.attempts} attempt(s) ({verdict}, last error: "
                    f"{error_name or failure.value}); resending with the same key is safe",
                    key=self.key,
                    attempts=self.attempts,
                    reason=verdict,
                ),
            )
        self._emit("retry", attempt=self.attempts, delay=delay, reason=reason, error=error_name)
        return Decision("retry", delay=delay, reason=reason)

    def _next(self, delay: float, reason: str) -> str | None:
        # Returns why no further attempt is allowed, or None when one is.
        if self.attempts >= self.policy.max_attempts:
            return "max_attempts"
        if self.policy.clock() + delay - self._started > self.policy.deadline:
            return "deadline"
        return None

    def _give_up(self, reason: str, error: ClientError, *, status: int) -> Decision:
        self._emit("give_up", attempts=self.attempts, reason=reason, status=status)
        return Decision("raise", error=error, reason=reason)

    def _emit(self, event: str, **details: object) -> None:
        payload: dict[str, object] = {"method": self.method, "url": self.url, **details}
        if self.key is not None:
            payload["key_id"] = hashlib.sha256(self.key.encode()).hexdigest()[:12]
            if self.policy.log_keys:
                payload["key"] = self.key
        if self.operation is not None:
            payload["operation_id"] = self.operation.id
        # The caller gets the verdict itself (a response or an exception): no warnings here.
        level = logging.INFO if event == "give_up" else logging.DEBUG
        if _logger.isEnabledFor(level):
            _logger.log(level, "retrysafe.client %s %s", event, payload)
        hook = self.policy.on_event
        if hook is not None:
            try:
                hook(event, payload)
            except Exception:
                # A broken metrics hook must not turn a sent request into a failed call.
                _logger.exception("retrysafe.client on_event hook failed")


def _replayed(headers: Mapping[str, str]) -> bool:
    for name in ("idempotency-replayed", "idempotent-replayed"):
        if headers.get(name, "").strip().lower() == "true":
            return True
    return False
