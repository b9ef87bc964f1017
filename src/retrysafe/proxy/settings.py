"""The proxy's settings: the options, the per-route policies, how a request is scoped."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from .._core.config import IdempotencyConfig, ScopeResolver
from .._core.errors import ConfigurationError
from .._core.scope import authorization_scope, credential_scope

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]


_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


@dataclass(frozen=True, kw_only=True, slots=True)
class RoutePolicy:
    """Idempotency policy of the paths one rule matches; ``None`` keeps the proxy-wide setting.

    Attributes:
        path: an exact path (``/payments``) or a prefix ending in ``*`` (``/orders/*``).
        enabled: ``False`` forwards these paths without any idempotency handling.
        methods: the protected methods on these paths.
        required: a protected request without a key gets ``400``.
        ttl: retention of these paths' records, in seconds.
        lease: lease of these paths' reservations, in seconds.
    """

    path: str
    enabled: bool = True
    methods: frozenset[str] | None = None
    required: bool | None = None
    ttl: float | None = None
    lease: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path.startswith("/"):
            raise ConfigurationError(f"route path must start with '/', got {self.path!r}")
        if "*" in self.path[:-1]:
            raise ConfigurationError(f"route path may only end in '*', got {self.path!r}")

    def matches(self, path: str) -> bool:
        """Return whether a request path falls under this rule."""
        if self.path.endswith("*"):
            return path.startswith(self.path[:-1])
        return path == self.path


@dataclass(frozen=True, kw_only=True, slots=True)
class ProxySettings:
    """Everything ``retrysafe proxy`` is configured with (see :data:`OPTIONS` for the sources).

    Attributes:
        upstream: base URL of the backend (``http://127.0.0.1:9000``, optionally with a path).
        store: the store URL.
        listen: ``HOST:PORT`` the proxy serves on.
        workers: uvicorn worker processes.
        log_level: uvicorn's log level.
        methods: protected methods.
        required: a protected request without a key gets ``400``.
        ttl: retention of completed records, seconds.
        lease: lease of reservations, seconds.
        max_body_size: keyed request bodies above this get ``413`` (and are never forwarded).
        max_stored_body_size: larger responses stream through but are not stored.
        on_conflict: ``"reject"`` (409) or ``"wait"`` for the first request of a key.
        store_server_errors: store upstream 5xx answers too (default: released).
        on_ambiguous: ``"unknown"``: a request sent without an answer is never forwarded again
            (409 outcome-unknown); ``"release"``: free the key (for idempotent upstreams).
        principal_header: the request header whose value scopes keys (a hash of it).
        trust_forwarded: keep and extend the client's ``Forwarded``/``X-Forwarded-*`` headers
            (only behind a proxy you trust); otherwise they are replaced.
        connect_timeout: seconds to connect to the upstream (or wait for a pooled connection).
        upstream_timeout: seconds to wait for each read or write of the upstream.
        max_connections: size of the upstream connection pool (per worker).
        routes: per-path policies, first match wins.
    """

    upstream: str
    store: str
    listen: str = "127.0.0.1:8080"
    workers: int = 1
    log_level: str = "info"
    methods: frozenset[str] = frozenset({"POST", "PATCH"})
    required: bool = False
    ttl: float = 24 * 3600.0
    lease: float = 30.0
    max_body_size: int = 1024 * 1024
    max_stored_body_size: int = 1024 * 1024
    on_conflict: Literal["reject", "wait"] = "reject"
    store_server_errors: bool = False
    on_ambiguous: Literal["unknown", "release"] = "unknown"
    principal_header: str = "authorization"
    trust_forwarded: bool = False
    connect_timeout: float = 5.0
    upstream_timeout: float = 60.0
    max_connections: int = 100
    routes: tuple[RoutePolicy, ...] = field(default=())

    def __post_init__(self) -> None:
        parts = urlsplit(self.upstream)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(
                f"upstream must be an http:// or https:// URL with a host, got {self.upstream!r}"
            )
        if parts.query or parts.fragment:
            raise ConfigurationError(f"upstream must not carry a query, got {self.upstream!r}")
        self.listen_address()  # validates
        if self.workers < 1:
            raise ConfigurationError(f"workers must be at least 1, got {self.workers}")
        if self.workers > 1 and self.store.startswith("memory:"):
            # Each worker would hold its own records: the same key could run once per worker.
            raise ConfigurationError(
                "memory:// lives in one process: with several workers use a shared store "
                "(sqlite:///path.db, postgresql://..., redis://...)"
            )
        if self.log_level not in _LOG_LEVELS:
            raise ConfigurationError(
                f"log_level must be one of {', '.join(_LOG_LEVELS)}, got {self.log_level!r}"
            )
        if self.on_ambiguous not in ("unknown", "release"):
            raise ConfigurationError("on_ambiguous must be 'unknown' or 'release'")
        if not self.principal_header or not self.principal_header.isascii():
            raise ConfigurationError(f"bad principal header name {self.principal_header!r}")
        object.__setattr__(self, "principal_header", self.principal_header.lower())
        for name in ("connect_timeout", "upstream_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigurationError(f"{name} must be positive")
        if self.max_connections < 1:
            raise ConfigurationError("max_connections must be at least 1")
        # The middleware's own checks, at start-up, for the proxy and every route.
        for route in (None, *self.routes):
            self.idempotency_config(route)

    def listen_address(self) -> tuple[str, int]:
        """Return ``(host, port)`` of :attr:`listen`."""
        host, sep, port = self.listen.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigurationError(f"listen must be HOST:PORT, got {self.listen!r}")
        return host, int(port)

    def idempotency_config(self, route: RoutePolicy | None = None) -> IdempotencyConfig:
        """Return the middleware settings of the proxy, or of one route."""
        config = IdempotencyConfig(
            methods=self.methods,
            required=self.required,
            ttl=self.ttl,
            lease=self.lease,
            max_body_size=self.max_body_size,
            max_stored_body_size=self.max_stored_body_size,
            on_conflict=self.on_conflict,
            store_server_errors=self.store_server_errors,
            scope_resolver=header_scope_resolver(self.principal_header),
        )
        if route is None:
            return config
        changes: dict[str, Any] = {
            name: getattr(route, name)
            for name in ("methods", "required", "ttl", "lease")
            if getattr(route, name) is not None
        }
        try:
            return dataclasses.replace(config, **changes) if changes else config
        except ConfigurationError as exc:
            raise ConfigurationError(f"route {route.path}: {exc}") from exc

    def to_json(self) -> str:
        """Serialize (for the worker processes, which rebuild the settings from it)."""

        def plain(value: Any) -> Any:
            if isinstance(value, frozenset):
                return sorted(value)
            if isinstance(value, tuple):
                return [plain(v) for v in value]
            if isinstance(value, RoutePolicy):
                return {
                    f.name: plain(getattr(value, f.name))
                    for f in dataclasses.fields(value)
                    if getattr(value, f.name) is not None
                }
            return value

        return json.dumps({f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)})

    @classmethod
    def from_json(cls, text: str) -> ProxySettings:
        """Rebuild settings written by :meth:`to_json`."""
        data = json.loads(text)
        data["methods"] = frozenset(data["methods"])
        data["routes"] = tuple(_route(r, "settings") for r in data["routes"])
        return cls(**data)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_ROUTE_KEYS = {"path", "enabled", "methods", "required", "ttl", "lease"}


def _convert(name: str, kind: str, value: Any, source: str) -> Any:
    """Turn a flag, variable or TOML value into the option's type (bad values: one clear line)."""
    try:
        if kind == "str":
            if not isinstance(value, str):
                raise TypeError
            return value
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, int | str):
                raise TypeError
            return int(value)
        if kind == "float":
            if isinstance(value, bool) or not isinstance(value, int | float | str):
                raise TypeError
            return float(value)
        if kind == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
                return value.strip().lower() in _TRUE
            raise TypeError
        if kind == "methods":
            items = value.split(",") if isinstance(value, str) else value
            if not isinstance(items, list | tuple | frozenset | set):
                raise TypeError
            methods = frozenset(str(m).strip().upper() for m in items if str(m).strip())
            if not all(m.isalpha() for m in methods):
                raise TypeError
            return methods
    except (TypeError, ValueError):
        raise ConfigurationError(f"{source}: bad value for {name}: {value!r}") from None
    raise AssertionError(kind)  # pragma: no cover


def _route(raw: Any, source: str) -> RoutePolicy:
    if not isinstance(raw, dict):
        raise ConfigurationError(f"{source}: each [[routes]] entry must be a table")
    unknown = set(raw) - _ROUTE_KEYS
    if unknown:
        raise ConfigurationError(
            f"{source}: unknown route key {sorted(unknown)[0]!r} (known: {sorted(_ROUTE_KEYS)})"
        )
    if "path" not in raw:
        raise ConfigurationError(f"{source}: a route needs a path")
    kinds = {"path": "str", "enabled": "bool", "methods": "methods", "required": "bool"}
    values = {
        key: _convert(f"routes.{key}", kinds.get(key, "float"), value, source)
        for key, value in raw.items()
    }
    return RoutePolicy(**values)


def header_scope_resolver(header: str) -> ScopeResolver:
    """Scope keys by the value of one request header (a hash of it; global when absent).

    ``Authorization`` is normalized as RFC 9110 allows (the scheme's case, the spaces after
    it), like the default principal of every front; any other header (an API key) is compared
    exactly, byte for byte. For a value without spaces both hashes are the same, so
    ``retrysafe resolve --authorization '<header value>'`` finds a key whatever header is
    configured.

    Args:
        header: the header name, e.g. ``authorization`` or ``x-api-key``.

    Returns:
        A ``scope_resolver`` for :class:`~retrysafe.IdempotencyConfig`.
    """
    raw = header.lower().encode("latin-1")
    scope_of = authorization_scope if raw == b"authorization" else credential_scope

    def resolve(request: Any) -> str:
        # Given the ASGI scope today; the neutral request head (``.headers``: byte pairs) once
        # the flow rewrite lands: both carry lower-case (name, value) byte pairs.
        pairs = request.get("headers", ()) if isinstance(request, Mapping) else request.headers
        values = [value for name, value in pairs if name == raw]
        if not values:
            return ""
        return scope_of(values[0] if len(values) == 1 else b", ".join(values))

    return resolve
