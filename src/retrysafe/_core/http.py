"""The HTTP layer of the keyed operation, sans-I/O: every row of the wire contract (DESIGN
section 2) decided here.

Shells build a :class:`~retrysafe._core.request.Request` and call :func:`admit`; the request's
:class:`Flow` (a :class:`~retrysafe._core.operation.Operation`) then decides everything else.
What is HTTP's own lives here: admission, the status policy (which responses are stored), the
stored response's encoding, replays, and the RFC 9457 problem answers; the claim, the fenced
settlement, the transaction, renewal and "outcome unknown" are the operation's
(:mod:`retrysafe._core.operation`).

Phases:

- :func:`admit`: pass-through, ``400`` missing or malformed key, ``413`` declared too large;
  while the shell reads the body, :func:`too_large` and :func:`client_gone`.
- :meth:`Flow.claim`: reserve, then replay, ``409`` in progress (or wait), ``422`` mismatch,
  ``409`` outcome unknown, ``503`` or fail-open when the store fails; or "execute".
- :meth:`Flow.settle`: the handler's response is final: status policy, fenced completion, the
  transactional commit, outcome unknown after committed effects, release, and the deferred
  completion after a store error (:meth:`Flow.complete_later`).
- :meth:`Flow.failed` / :meth:`Flow.incomplete`: the handler raised or never finished.
- :meth:`Flow.renew`, :meth:`Flow.mark_committed`: what runs beside the handler.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Mapping
from email.utils import formatdate
from typing import Any

from .codec import RawHeaders, decode, encode
from .config import IdempotencyConfig
from .errors import CodecError, InvalidKeyError, StoreError
from .events import LOG_LEVELS
from .fingerprint import fingerprint
from .keys import parse_key, record_id
from .operation import (
    EMIT,
    EXECUTE,
    NOW,
    RUN_UNPROTECTED,
    TX_STATE,
    Action,
    Operation,
    Steps,
    report,
    retry_after,
)
from .problems import render_problem
from .request import Request
from .scope import default_principal

__all__ = [
    "EXECUTE",
    "RUN_UNPROTECTED",
    "Answer",
    "Capture",
    "Flow",
    "admit",
    "client_gone",
    "notify",
    "problem",
    "too_large",
]

logger = logging.getLogger("retrysafe")

_BODY_OMITTED = (b"idempotency-body-omitted", b"true")


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


def client_gone() -> Answer:
    """``400`` with no body: the request body ended before it was complete (the client left, or
    closed its side early). Nothing ran and no key was reserved, so the client's retry runs as if
    this request had never come. Every shell sends it as it sends any answer; it reaches a client
    that only closed its side (a left one reads nothing, and the server may drop it)."""
    return Answer(400, [(b"content-length", b"0")], b"", event="client_gone")


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


def _request_details(request: Request, record: str) -> dict[str, Any]:
    return {
        "record": record[:16] or None,
        "path": request.path,
        "method": request.method,
        "route": request.route,
    }


def notify(
    config: IdempotencyConfig,
    event: str,
    request: Request,
    record: str,
    extra: Mapping[str, object] | None = None,
) -> None:
    """Report ``event`` of a request: one structured log line when it is non-trivial (see
    :mod:`retrysafe._core.events`), and the ``on_event`` hook (a failing hook is logged, never
    raised). Routine events cost nothing without a hook."""
    if config.on_event is None and event not in LOG_LEVELS:
        return
    report(config, event, _request_details(request, record), extra)


class Flow(Operation[Answer]):
    """One keyed request from its reservation to its settlement.

    Args:
        config: the request's settings (route overrides applied).
        request: the neutral request head.
        key: the parsed ``Idempotency-Key`` (from :func:`admit`).
        body: the whole request body.
    """

    __slots__ = ("added_headers", "holds_response", "request")

    def __init__(self, config: IdempotencyConfig, request: Request, key: str, body: bytes) -> None:
        resolver = config.scope_resolver
        if resolver is not None:
            principal = resolver(request)
        elif request.user is None and not request.authorization:
            principal = ""  # anonymous: global scope (the common case, without two calls)
        else:
            principal = default_principal(request)
        Operation.__init__(
            self,
            config,
            record_id(principal, request.method, request.exact_path, key),
            fingerprint(
                request.method,
                request.exact_path,
                request.query,
                body,
                canonical_json=config.canonical_json,
                content_type=request.content_type,
            ),
        )
        self.request = request
        #: No byte of the response may leave before :meth:`settle` (transactional mode: the
        #: commit may still fail and turn the answer into a ``503``).
        self.holds_response = config.transactional
        #: Headers the flow adds to the handler's response (and stores with it).
        self.added_headers: list[tuple[bytes, bytes]] = []

    # -- the operation's hooks: HTTP answers ---------------------------------------------------

    def details(self) -> dict[str, Any]:
        """The request's method, path and route, and the hashed record prefix."""
        return _request_details(self.request, self.record_id)

    def kind(self) -> tuple[str, str]:
        """Requests are timed per method and path."""
        return (self.request.method, self.request.path)

    def observe(self, seconds: float) -> None:
        """See :meth:`Operation.observe` (every keyed request passes here: :meth:`kind` inlined,
        one call less, about 1k instructions of a WSGI new key)."""
        if self.estimates is not None:
            self.estimates.observe((self.request.method, self.request.path), seconds)

    def won(self) -> Steps | None:
        """The retention header, when configured, is added to the first response."""
        if self.config.retention_header is None:
            return None
        return self._retention_header()

    def _retention_header(self) -> Steps:
        config = self.config
        assert config.retention_header is not None
        now: float = yield NOW, None
        expires = formatdate(now + config.ttl, usegmt=True).encode("ascii")
        self.added_headers = [(config.retention_header.lower().encode("ascii"), expires)]

    def replay(self, data: bytes) -> Generator[Action, Any, Answer]:
        """The stored response, replayed with the replay headers."""
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
        return self._replay_answer(status, headers, body, omitted)

    def replay_now(self, data: bytes) -> Answer | None:
        """:meth:`replay` without its generator when it has nothing to report (no hook) and
        ``data`` reads (the hot path of a replay)."""
        if self.config.on_event is not None:
            return None
        try:
            status, headers, body, omitted = decode(data)
        except CodecError:
            return None  # replay() answers it
        return self._replay_answer(status, headers, body, omitted)

    def _replay_answer(
        self, status: int, headers: list[tuple[bytes, bytes]], body: bytes, omitted: bool
    ) -> Answer:
        if omitted:
            headers = [(n, v) for n, v in headers if n != b"content-length"]
            headers.append((b"content-length", b"0"))
            headers.append(_BODY_OMITTED)
        headers.extend(self.config._replayed_raw)
        return Answer(status, headers, body)

    def reused(self) -> Answer:
        """``422`` ``idempotency-key-reused``."""
        return problem(
            self.config,
            "idempotency-key-reused",
            "This Idempotency-Key was used with a different request (method, path, query or body).",
        )

    def unknown(self) -> Answer:
        """``409`` ``idempotency-outcome-unknown``."""
        return problem(
            self.config,
            "idempotency-outcome-unknown",
            "The first request with this Idempotency-Key committed its effects but its "
            "response was never stored. It will not run again; an operator must resolve "
            "the key (retrysafe resolve).",
        )

    def in_progress(self, seconds: int) -> Answer:
        """``409`` ``idempotency-request-in-progress`` with ``Retry-After``."""
        return problem(
            self.config,
            "idempotency-request-in-progress",
            "The first request with this Idempotency-Key is still being processed; retry later.",
            retry_after=seconds,
        )

    def fenced(self) -> Answer:
        """``409`` in progress, ``Retry-After`` of a whole lease: the writes were rolled back."""
        return problem(
            self.config,
            "idempotency-request-in-progress",
            "The lease of this request was taken over; its writes were rolled back. Retry later.",
            retry_after=retry_after(self.config.lease),
        )

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

    # -- settlement ------------------------------------------------------------------------

    def settle(
        self, status: int, headers: RawHeaders, body: bytes, omitted: bool
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
        data = self.stored(status, headers, body, omitted)
        if self.in_tx:
            return (yield from self.settle_transaction(data))
        yield from self.settle_data(data)
        return None

    def settle_plain(
        self, status: int, headers: RawHeaders, body: bytes, omitted: bool
    ) -> Generator[Action, Any, None]:
        """:meth:`settle` outside transactional mode (the operation's own generator, no
        delegation)."""
        return self.settle_data(self.stored(status, headers, body, omitted))

    def stored(self, status: int, headers: RawHeaders, body: bytes, omitted: bool) -> bytes | None:
        """The encoded response when the status policy stores it, else ``None`` (outside
        transactional mode the runner settles with it itself: see :meth:`settle`)."""
        config = self.config
        if not config.should_store(status):
            return None
        return encode(
            status,
            headers,
            body,
            omitted,
            deny=config._deny_raw,
            allow=config._allow_raw,
            added=self.added_headers,
        )

    def failed(self, error: BaseException, started: bool) -> Generator[Action, Any, Answer | None]:
        """The handler raised before its response was settled.

        Args:
            error: what it raised.
            started: whether the response had started (its status is known).

        Returns:
            An :class:`Answer` to send instead of the error, or ``None``: re-raise it.
        """
        failure: tuple[str, str] | None = None  # (detail, phase) of a 503
        if not started and isinstance(error, StoreError):
            # The handler's transaction could not begin (lock, pool or connection): a store
            # failure like any other, answered 503, never a 500 with a traceback.
            failure = ("The idempotency store cannot be reached; retry later.", "handler")
        elif not started and self.in_tx and isinstance(error, Exception):
            _, broken = yield TX_STATE, None
            if broken:
                # The handler failed because its transaction's connection died (e.g. a
                # terminated backend): a store failure, answered 503 like the others.
                detail = "The database connection was lost; retry with the same key."
                failure = (detail, "transaction")
        yield from self.abandon()
        if failure is None:
            return None
        detail, phase = failure
        return (yield from self.unavailable(detail, error=error, phase=phase))

    def incomplete(self) -> Steps:
        """The handler returned without finishing its response."""
        logger.warning("handler of %s returned without finishing its response", self.record_id[:12])
        yield from self.abandon()
