"""Configuration: frozen keyword-only dataclasses, validated once at start-up."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from .errors import ConfigurationError
from .request import Request

__all__ = [
    "DEFAULT_RELEASE_STATUSES",
    "DEFAULT_REPLAY_HEADER_DENYLIST",
    "EventHook",
    "IdempotencyConfig",
    "RouteOptions",
    "ScopeResolver",
    "front_config",
]

#: Returns the principal a request acts for ("" for global), given the neutral request (the same
#: object on every front: ASGI, WSGI, Flask, Django).
ScopeResolver = Callable[[Request], str]

#: Receives ``(event, details)``; see :attr:`IdempotencyConfig.on_event`.
EventHook = Callable[[str, Mapping[str, Any]], None]

#: Request-level rejections: nothing ran, so the key is released and the client may correct and
#: retry with the same key (DESIGN section 2). Every 5xx is released too.
DEFAULT_RELEASE_STATUSES: frozenset[int] = frozenset(
    {400, 401, 403, 408, 409, 413, 415, 422, 425, 429}
)

#: Never stored, never replayed: credentials, cookies and hop-by-hop headers.
DEFAULT_REPLAY_HEADER_DENYLIST: frozenset[str] = frozenset(
    {
        "set-cookie",
        "authorization",
        "proxy-authorization",
        "www-authenticate",
        "proxy-authenticate",
        "authentication-info",
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "date",
        "server",
    }
)


#: An HTTP field name (RFC 9110 token).
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def _positive(name: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise ConfigurationError(f"{name} must be positive, got {value!r}")


def _collection(name: str, value: object) -> None:
    if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
        raise ConfigurationError(f"{name} must be a set of values, got {value!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class IdempotencyConfig:
    """Settings of the idempotency layer (app-wide defaults; routes may override some).

    Attributes:
        methods: HTTP methods that are protected; others pass straight through.
        required: a protected request without a key gets ``400`` (else it runs unprotected).
        ttl: seconds a completed record is kept and replayed (retention).
        lease: seconds a reservation is held without renewal; the running request renews it
            every ``lease / 3``. A crashed process's key is taken over after this long.
        max_body_size: request bodies above this many bytes get ``413`` and nothing runs.
        max_stored_body_size: response bodies above this are not stored; the record keeps status
            and headers and the replay carries ``Idempotency-Body-Omitted: true``.
        on_conflict: ``"reject"`` answers ``409`` while the first request runs; ``"wait"`` waits
            up to ``conflict_wait`` seconds for it to finish and replays it.
        conflict_wait: the longest wait of ``on_conflict="wait"``.
        on_store_error: ``"fail_closed"`` answers ``503`` + ``Retry-After`` when the store fails;
            ``"fail_open"`` runs the request unprotected (logged).
        store_retry_after: the ``Retry-After`` seconds sent with a ``503``.
        canonical_json: fingerprint JSON bodies in canonical form (sorted keys, no white space).
        release_statuses: statuses that are not stored (the key is released). Every 5xx is
            released unless ``store_server_errors``.
        store_server_errors: keep 5xx responses too (rarely wanted).
        replay_header_denylist: lower-case header names never stored.
        replay_header_allowlist: when set, only these lower-case header names are stored.
        scope_resolver: the principal of a request, given the neutral
            :class:`~retrysafe.Request`; default: the framework's authenticated user, else a
            hash of the ``Authorization`` header, else global.
        transactional: run each keyed request in a database transaction of the SQL store
            (SQLite, PostgreSQL): the handler's writes on :func:`retrysafe.transaction`'s
            connection commit together with the stored response (exactly-once effects).
        on_event: called as ``hook(event, details)`` for ``executed``, ``settled``,
            ``replayed``, ``conflict``, ``mismatch``, ``missing_key``, ``invalid_key``,
            ``too_large``, ``client_gone`` (the body ended early), ``outcome_unknown``,
            ``store_error`` (answered 503), ``fail_open``,
            ``completion_deferred``, ``completion_recovered``, ``completion_failed`` and
            ``lease_lost``; ``details`` carries ``record`` (a hashed prefix, never the key),
            ``method``, ``path``, ``route`` (the template when known), and ``error``/``phase``
            where they apply (metrics, alerts: :mod:`retrysafe.contrib.prometheus`). It must not
            block.
        problem_type_base: prefix of the RFC 9457 ``type`` of error responses.
        documentation_url: when set, errors carry ``Link: <url>; rel="describedby"``.
        detach_handler: run the handler in a task of its own, so that a server that cancels the
            request when its client disconnects cannot cancel the handler and its response is
            still stored (guarantee 4). ``"auto"`` (default) skips it under uvicorn, which never
            cancels a request (it reports the disconnect instead), saving a task and two event
            loop turns per request; ``"always"``; ``"never"``.
        replay_headers: headers set to ``true`` on every replay: ``Idempotency-Replayed`` (the
            draft's practice) by default; add ``Idempotent-Replayed`` for clients written
            against Stripe (its SDKs read that one).
        retention_header: when set (e.g. ``"Idempotency-Key-Expires"``), first responses and
            their replays carry this header with the HTTP date until which retries with the
            key are deduplicated (the record's retention). Experimental: the draft defines no
            such field yet.
        adaptive_retry_after: a ``409`` in-progress answer's ``Retry-After`` says when the
            first request is likely done (a running estimate of how long the route's requests
            take in this process, bounded by the remaining lease, at least 1 s) rather than
            when its lease ends; ``False``: the remaining lease.
    """

    methods: frozenset[str] = frozenset({"POST", "PATCH"})
    required: bool = False
    ttl: float = 24 * 3600.0
    lease: float = 30.0
    max_body_size: int = 1024 * 1024
    max_stored_body_size: int = 1024 * 1024
    on_conflict: Literal["reject", "wait"] = "reject"
    conflict_wait: float = 10.0
    on_store_error: Literal["fail_closed", "fail_open"] = "fail_closed"
    store_retry_after: int = 1
    canonical_json: bool = False
    release_statuses: frozenset[int] = DEFAULT_RELEASE_STATUSES
    store_server_errors: bool = False
    replay_header_denylist: frozenset[str] = DEFAULT_REPLAY_HEADER_DENYLIST
    replay_header_allowlist: frozenset[str] | None = None
    scope_resolver: ScopeResolver | None = None
    transactional: bool = False
    on_event: EventHook | None = None
    problem_type_base: str = "urn:retrysafe:problem:"
    documentation_url: str | None = None
    detach_handler: Literal["auto", "always", "never"] = "auto"
    replay_headers: tuple[str, ...] = ("Idempotency-Replayed",)
    retention_header: str | None = None
    adaptive_retry_after: bool = True
    # Derived once, for the hot path: header names as the bytes ASGI carries.
    _deny_raw: frozenset[bytes] = field(init=False, repr=False, compare=False, default=frozenset())
    _allow_raw: frozenset[bytes] | None = field(init=False, repr=False, compare=False, default=None)
    _replayed_raw: tuple[tuple[bytes, bytes], ...] = field(
        init=False, repr=False, compare=False, default=()
    )

    def __post_init__(self) -> None:
        # A bare string is iterable, so methods="POST" would silently protect {"P", "O", ...}.
        for name in ("methods", "release_statuses", "replay_header_denylist"):
            _collection(name, getattr(self, name))
        if self.replay_header_allowlist is not None:
            _collection("replay_header_allowlist", self.replay_header_allowlist)
        object.__setattr__(self, "methods", frozenset(m.upper() for m in self.methods))
        if not self.methods:
            raise ConfigurationError("methods must name at least one HTTP method")
        for name in ("ttl", "lease", "conflict_wait"):
            _positive(name, getattr(self, name))
        if self.lease > self.ttl:
            raise ConfigurationError("lease must not be longer than ttl")
        for name in ("max_body_size", "max_stored_body_size", "store_retry_after"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ConfigurationError(f"{name} must be a non-negative integer, got {value!r}")
        if self.on_conflict not in ("reject", "wait"):
            raise ConfigurationError("on_conflict must be 'reject' or 'wait'")
        if self.on_store_error not in ("fail_closed", "fail_open"):
            raise ConfigurationError("on_store_error must be 'fail_closed' or 'fail_open'")
        if any(not 100 <= s <= 599 for s in self.release_statuses):
            raise ConfigurationError("release_statuses must be HTTP status codes")
        object.__setattr__(
            self,
            "replay_header_denylist",
            frozenset(h.lower() for h in self.replay_header_denylist),
        )
        if self.replay_header_allowlist is not None:
            object.__setattr__(
                self,
                "replay_header_allowlist",
                frozenset(h.lower() for h in self.replay_header_allowlist),
            )
        if self.scope_resolver is not None and not callable(self.scope_resolver):
            raise ConfigurationError("scope_resolver must be callable")
        if self.on_event is not None and not callable(self.on_event):
            raise ConfigurationError("on_event must be callable")
        if self.detach_handler not in ("auto", "always", "never"):
            raise ConfigurationError("detach_handler must be 'auto', 'always' or 'never'")
        _collection("replay_headers", self.replay_headers)
        object.__setattr__(self, "replay_headers", tuple(self.replay_headers))
        for name in (*self.replay_headers, self.retention_header or "x"):
            if not isinstance(name, str) or not _TOKEN.fullmatch(name):
                raise ConfigurationError(f"not an HTTP header name: {name!r}")
        object.__setattr__(
            self,
            "_replayed_raw",
            tuple((h.lower().encode("ascii"), b"true") for h in self.replay_headers),
        )
        object.__setattr__(
            self, "_deny_raw", frozenset(h.encode("latin-1") for h in self.replay_header_denylist)
        )
        if self.replay_header_allowlist is not None:
            object.__setattr__(
                self,
                "_allow_raw",
                frozenset(h.encode("latin-1") for h in self.replay_header_allowlist),
            )

    def should_store(self, status: int) -> bool:
        """Return whether a response with this status is stored (else the key is released)."""
        if status >= 500:
            return self.store_server_errors
        return status not in self.release_statuses

    def with_route(self, options: RouteOptions | None) -> IdempotencyConfig:
        """Return these settings with a route's overrides applied."""
        if options is None:
            return self
        changes = {
            f.name: getattr(options, f.name)
            for f in fields(options)
            if f.name != "enabled" and getattr(options, f.name) is not None
        }
        return replace(self, **changes) if changes else self


@dataclass(frozen=True, kw_only=True, slots=True)
class RouteOptions:
    """Per-route overrides; ``None`` keeps the app-wide setting.

    Attributes:
        enabled: ``False`` opts the route out of idempotency handling.
        required: a key is required on this route.
        ttl: retention of this route's records, in seconds.
        lease: lease of this route's reservations, in seconds.
        on_conflict: ``"reject"`` or ``"wait"``.
        canonical_json: fingerprint JSON bodies in canonical form.
        scope_resolver: the principal of a request on this route.
        release_statuses: statuses not stored on this route.
    """

    enabled: bool = True
    required: bool | None = None
    ttl: float | None = None
    lease: float | None = None
    on_conflict: Literal["reject", "wait"] | None = None
    canonical_json: bool | None = None
    scope_resolver: ScopeResolver | None = None
    release_statuses: frozenset[int] | None = None

    def __post_init__(self) -> None:
        _positive("ttl", self.ttl)
        _positive("lease", self.lease)
        if self.on_conflict not in (None, "reject", "wait"):
            raise ConfigurationError("on_conflict must be 'reject' or 'wait'")


def front_config(
    config: IdempotencyConfig | None, options: Mapping[str, Any], store: object
) -> IdempotencyConfig:
    """The settings a front (middleware, extension) was given, checked against its store.

    Args:
        config: ``config=``, or ``None``.
        options: the keyword options (fields of :class:`IdempotencyConfig`).
        store: the resolved store.

    Raises:
        ConfigurationError: both or bad settings, or transactional mode without a SQL store.
    """
    if config is not None and options:
        raise ConfigurationError("pass either config= or keyword options, not both")
    resolved = config if config is not None else IdempotencyConfig(**options)
    if resolved.transactional and not callable(getattr(store, "begin", None)):
        raise ConfigurationError(
            f"transactional=True needs a SQL store (SQLite or PostgreSQL), not "
            f"{type(store).__name__}"
        )
    return resolved
