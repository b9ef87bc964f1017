"""Configuration: frozen keyword-only dataclasses, validated once at start-up."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from .errors import ConfigurationError
from .options import (
    Coerce,
    ConfigSource,
    Setting,
    boolean,
    choice,
    count,
    function,
    header_list,
    header_name,
    header_set,
    method_set,
    optional,
    read_options,
    seconds,
    status_set,
    text,
)
from .request import Request

__all__ = [
    "DEFAULT_RELEASE_STATUSES",
    "DEFAULT_REPLAY_HEADER_DENYLIST",
    "OPTIONS",
    "ROUTE_OPTIONS",
    "EventHook",
    "IdempotencyConfig",
    "RouteOptions",
    "ScopeResolver",
    "check_store",
    "coerce_fields",
    "config_from",
    "front_config",
    "front_store",
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


#: How each option of :class:`IdempotencyConfig` is checked and read, from any source: the one
#: coercion table (the constructor, :meth:`IdempotencyConfig.from_mapping` and every front use it).
OPTIONS: dict[str, Coerce] = {
    "methods": method_set,
    "required": boolean,
    "ttl": seconds,
    "lease": seconds,
    "max_body_size": count,
    "max_stored_body_size": count,
    "on_conflict": choice("reject", "wait"),
    "conflict_wait": seconds,
    "on_store_error": choice("fail_closed", "fail_open"),
    "store_retry_after": count,
    "canonical_json": boolean,
    "release_statuses": status_set,
    "store_server_errors": boolean,
    "replay_header_denylist": header_set,
    "replay_header_allowlist": optional(header_set),
    "scope_resolver": optional(function),
    "transactional": boolean,
    "on_event": optional(function),
    "problem_type_base": text,
    "documentation_url": optional(text),
    "detach_handler": choice("auto", "always", "never"),
    "replay_headers": header_list,
    "retention_header": optional(header_name),
    "adaptive_retry_after": boolean,
}

#: The options of :class:`RouteOptions` (``None``: keep the app-wide setting).
ROUTE_OPTIONS: dict[str, Coerce] = {
    "enabled": boolean,
    **{
        name: optional(OPTIONS[name])
        for name in (
            "required",
            "ttl",
            "lease",
            "on_conflict",
            "canonical_json",
            "scope_resolver",
            "release_statuses",
        )
    },
}


def coerce_fields(instance: object, table: Mapping[str, Coerce]) -> None:
    """Check (and convert, see :mod:`.options`) every field of a settings dataclass in place."""
    owner = type(instance).__name__
    for name, coerce in table.items():
        value = getattr(instance, name)
        try:
            checked = coerce(value)
        except ValueError as exc:
            raise ConfigurationError(f"{owner}({name}=...): {exc}", option=name) from None
        if checked is not value:
            object.__setattr__(instance, name, checked)


def _lease_problem(lease: float, ttl: float, ttl_at: str = "ttl") -> str | None:
    if lease > ttl:
        return f"must not be longer than {ttl_at} ({ttl:g} s), got {lease:g}"
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class IdempotencyConfig:
    """Settings of the idempotency layer (app-wide defaults; routes may override some).

    Every value is checked, and text read, by its entry in :data:`OPTIONS` (``ttl="1d"`` is a
    day, ``methods="POST, PATCH"`` two methods); :meth:`from_mapping` reads any other source
    (``app.config``, TOML, variables, flags) the same way.

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
        canonical_json: fingerprint JSON bodies in canonical form (sorted keys, no white space);
            a body with a number that a float does not write back as sent (``0.10``, ``1e400``)
            is fingerprinted raw, since an app that parses decimals tells such numbers apart.
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
        coerce_fields(self, OPTIONS)
        problem = _lease_problem(self.lease, self.ttl)
        if problem is not None:
            raise ConfigurationError(
                f"IdempotencyConfig(lease=...): {problem} (pass lease={self.ttl:g} or less)",
                option="lease",
            )
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
        """Return these settings with a route's overrides applied.

        A route that shortens ``ttl`` below the app's lease (and sets no lease) gets a lease of
        its ``ttl``: the merge never fails, it runs on the first request of the route.
        """
        if options is None:
            return self
        changes = {
            f.name: getattr(options, f.name)
            for f in fields(options)
            if f.name != "enabled" and getattr(options, f.name) is not None
        }
        _lease_follows_ttl(changes, self.lease)
        return replace(self, **changes) if changes else self

    @classmethod
    def from_mapping(
        cls,
        mapping: Mapping[str, Any],
        *,
        source: str | ConfigSource = "{key}",
        base: IdempotencyConfig | None = None,
    ) -> IdempotencyConfig:
        """Settings from a mapping of raw values: keyword arguments, ``app.config``, Django
        settings, TOML, environment variables, command-line flags.

        Each value is checked and converted by its option's entry in :data:`OPTIONS`: seconds
        from numbers or text (``30``, ``"30"``, ``"30s"``, ``"15m"``, ``"2h"``, ``"1d"``), lists
        and sets from lists or comma-separated text (``"POST, PATCH"``), booleans from
        ``true/false/1/0/yes/no/on/off``, functions from their dotted path
        (``"pkg.module:name"``), choices checked. When ``ttl`` is given shorter than the lease
        and ``lease`` is not, the lease follows it.

        Args:
            mapping: option name (as written at the source) -> raw value.
            source: where the mapping comes from: a name (``"proxy.toml"``: messages say
                ``ttl in proxy.toml``; default: the option alone) or a
                :class:`~retrysafe._core.options.ConfigSource` that also says how keys are
                spelt there (``RETRYSAFE_TTL``, ``--ttl``).
            base: settings the mapping overrides (default: the defaults).

        Returns:
            The checked settings.

        Raises:
            ConfigurationError: an unknown option (with "did you mean"), a value of the wrong
                type or out of range; the message names the option as written and its source.
        """
        return config_from(read_options(mapping, source, OPTIONS), base)


def _lease_follows_ttl(changes: dict[str, Any], lease: float) -> None:
    """A ``ttl`` shorter than the lease in force, given without a lease, brings the lease down
    to it (a reservation never outlives its record)."""
    ttl = changes.get("ttl")
    if ttl is not None and changes.get("lease") is None and lease > ttl:
        changes["lease"] = ttl


def config_from(
    settings: Mapping[str, Setting], base: IdempotencyConfig | None = None
) -> IdempotencyConfig:
    """Build :class:`IdempotencyConfig` from options read by
    :func:`~retrysafe._core.options.read_options` (from one source or several merged).

    Raises:
        ConfigurationError: ``lease`` longer than ``ttl``, naming both as written.
    """
    base = base if base is not None else _DEFAULTS
    values = {name: setting.value for name, setting in settings.items()}
    _lease_follows_ttl(values, base.lease)
    ttl_at = settings["ttl"].at if "ttl" in settings else "ttl"
    problem = _lease_problem(values.get("lease", base.lease), values.get("ttl", base.ttl), ttl_at)
    if problem is not None:
        named = settings["lease"] if "lease" in settings else settings["ttl"]
        raise ConfigurationError(f"{named.at}: {problem}", option=named.key)
    return replace(base, **values) if values else base


@dataclass(frozen=True, kw_only=True, slots=True)
class RouteOptions:
    """Per-route overrides; ``None`` keeps the app-wide setting.

    Values are checked and converted as :data:`ROUTE_OPTIONS` says (the coercions of
    :class:`IdempotencyConfig`).

    Attributes:
        enabled: ``False`` opts the route out of idempotency handling.
        required: a key is required on this route.
        ttl: retention of this route's records, in seconds (the lease follows it when shorter
            and the route sets none).
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
        coerce_fields(self, ROUTE_OPTIONS)
        if self.lease is not None and self.ttl is not None:
            problem = _lease_problem(self.lease, self.ttl)
            if problem is not None:
                raise ConfigurationError(f"RouteOptions(lease=...): {problem}", option="lease")

    @classmethod
    def from_mapping(
        cls, mapping: Mapping[str, Any], *, source: str | ConfigSource = "{key}"
    ) -> RouteOptions:
        """Route options from raw values, read as :meth:`IdempotencyConfig.from_mapping`
        reads them.

        Raises:
            ConfigurationError: an unknown option or a bad value, named as written and where.
        """
        settings = read_options(mapping, source, ROUTE_OPTIONS)
        values = {name: setting.value for name, setting in settings.items()}
        if values.get("lease") is not None and values.get("ttl") is not None:
            problem = _lease_problem(values["lease"], values["ttl"], settings["ttl"].at)
            if problem is not None:
                lease = settings["lease"]
                raise ConfigurationError(f"{lease.at}: {problem}", option=lease.key)
        return cls(**values)


_DEFAULTS = IdempotencyConfig()


_MIDDLEWARE = ConfigSource.keywords("IdempotencyMiddleware")


def front_store(
    resolve: Callable[[Any], Any],
    store: Any,
    source: str | ConfigSource = _MIDDLEWARE,
    key: str | None = None,
) -> Any:
    """``resolve(store)`` (a store registry's resolver), its errors naming the store option.

    Args:
        resolve: e.g. :func:`~retrysafe.stores.resolve_async_store`.
        store: a store URL or object.
        source: where it was given (default: the middleware's keyword arguments).
        key: how the store option is written there (default: ``store`` as the source spells
            it).

    Raises:
        ConfigurationError: an unknown scheme, a missing extra, a bad URL.
    """
    where = ConfigSource.named(source)
    try:
        return resolve(store)
    except (ConfigurationError, ValueError) as exc:  # ValueError: a driver's own URL parsing
        raise where.error(key or where.key("store"), str(exc)) from exc


def check_store(config: IdempotencyConfig, store: object, at: str = "transactional=True") -> None:
    """Check the settings against the store they run on.

    Raises:
        ConfigurationError: transactional mode without a SQL store (one with ``begin``).
    """
    if config.transactional and not callable(getattr(store, "begin", None)):
        raise ConfigurationError(
            f"{at}: needs a SQL store (SQLite or PostgreSQL), not {type(store).__name__}"
        )


def front_config(
    config: IdempotencyConfig | None,
    options: Mapping[str, Any],
    store: object,
    source: str | ConfigSource = _MIDDLEWARE,
) -> IdempotencyConfig:
    """The settings a front (middleware, extension) was given, checked against its store.

    Args:
        config: ``config=``, or ``None``.
        options: the keyword options (fields of :class:`IdempotencyConfig`), read by
            :meth:`IdempotencyConfig.from_mapping`.
        store: the resolved store.
        source: where the options come from, for messages (``IdempotencyMiddleware(ttl=...)``).

    Raises:
        ConfigurationError: both or bad settings, or transactional mode without a SQL store.
    """
    if config is not None and options:
        raise ConfigurationError("pass either config= or keyword options, not both")
    if config is not None and not isinstance(config, IdempotencyConfig):
        raise ConfigurationError(f"config= must be an IdempotencyConfig, got {config!r}")
    if config is not None:
        check_store(config, store)
        return config
    settings = read_options(options, source, OPTIONS)
    resolved = config_from(settings)
    given = settings.get("transactional")
    check_store(resolved, store, given.at if given else "transactional=True")
    return resolved
