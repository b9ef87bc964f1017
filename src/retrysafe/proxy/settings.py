"""The proxy's settings: its own options, the middleware's (an :class:`IdempotencyConfig`), the
per-route policies, and how a request is scoped."""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from .._core.config import OPTIONS, IdempotencyConfig, ScopeResolver, coerce_fields
from .._core.errors import ConfigurationError
from .._core.options import (
    Coerce,
    boolean,
    choice,
    count,
    header_name,
    read_options,
    seconds,
    text,
)
from .._core.scope import authorization_scope, credential_scope

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]


_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")

#: The proxy's own options (the rest are :class:`IdempotencyConfig`'s, see
#: :data:`CONFIG_OPTIONS`), checked and read as every option is.
PROXY_OPTIONS: dict[str, Coerce] = {
    "upstream": text,
    "store": text,
    "listen": text,
    "workers": count,
    "log_level": choice(*_LOG_LEVELS),
    "access_log": boolean,
    "on_ambiguous": choice("unknown", "release"),
    "principal_header": header_name,
    "trust_forwarded": boolean,
    "connect_timeout": seconds,
    "upstream_timeout": seconds,
    "max_connections": count,
}

#: The middleware options the proxy takes: all of :class:`IdempotencyConfig`'s but
#: ``scope_resolver`` (``principal_header`` sets it) and ``transactional`` (the proxy writes to no
#: database of its own).
CONFIG_OPTIONS: dict[str, Coerce] = {
    name: coerce
    for name, coerce in OPTIONS.items()
    if name not in ("scope_resolver", "transactional")
}


@dataclass(frozen=True, kw_only=True, slots=True)
class RoutePolicy:
    """Idempotency policy of the paths one rule matches.

    Attributes:
        path: an exact path (``/payments``) or a prefix ending in ``*`` (``/orders/*``).
        enabled: ``False`` forwards these paths without any idempotency handling.
        options: :class:`IdempotencyConfig` options that differ on these paths (``required``,
            ``ttl``, ``methods``...), over the proxy-wide ones.
    """

    path: str
    enabled: bool = True
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path.startswith("/"):
            raise ConfigurationError(f"route path must start with '/', got {self.path!r}")
        if "*" in self.path[:-1]:
            raise ConfigurationError(f"route path may only end in '*', got {self.path!r}")
        coerce_fields(self, {"enabled": boolean})
        source = f"route {self.path}"
        read = read_options(self.options, source, CONFIG_OPTIONS)
        object.__setattr__(self, "options", {name: s.value for name, s in read.items()})

    def matches(self, path: str) -> bool:
        """Return whether a request path falls under this rule."""
        if self.path.endswith("*"):
            return path.startswith(self.path[:-1])
        return path == self.path


@dataclass(frozen=True, kw_only=True, slots=True)
class ProxySettings:
    """Everything ``retrysafe proxy`` is configured with (see
    :func:`~retrysafe.proxy.load_settings` for the sources).

    Attributes:
        upstream: base URL of the backend (``http://127.0.0.1:9000``, optionally with a path).
        store: the store URL.
        config: the middleware's settings (``methods``, ``required``, ``ttl``, ``lease``,
            ``max_body_size``...: every :class:`IdempotencyConfig` option but
            ``scope_resolver``, which ``principal_header`` sets, and ``transactional``).
        listen: ``HOST:PORT`` the proxy serves on.
        workers: uvicorn worker processes.
        log_level: uvicorn's log level.
        access_log: uvicorn's access log, a line per request (off by default: at ``info``
            it cost the proxy about 58 us of CPU per request, half of what forwarding costs).
        on_ambiguous: ``"unknown"``: a request sent without an answer is never forwarded again
            (409 outcome-unknown); ``"release"``: free the key (for idempotent upstreams).
        principal_header: the request header whose value scopes keys (a hash of it).
        trust_forwarded: keep and extend the client's ``Forwarded``/``X-Forwarded-*`` headers
            (only behind a proxy you trust); otherwise they are replaced.
        connect_timeout: seconds to connect to the upstream (or wait for a pooled connection).
        upstream_timeout: seconds to wait for each read or write of the upstream.
        max_connections: size of the upstream connection pool (per worker): at least the
            concurrency in front of the proxy, or requests queue in it for a connection (and,
            on Redis, pay a third store round trip: see ``proxy/_commit.py``). Connections
            open only when needed.
        routes: per-path policies, first match wins.
    """

    upstream: str
    store: str
    config: IdempotencyConfig = field(default_factory=IdempotencyConfig)
    listen: str = "127.0.0.1:8080"
    workers: int = 1
    log_level: str = "info"
    access_log: bool = False
    on_ambiguous: Literal["unknown", "release"] = "unknown"
    principal_header: str = "authorization"
    trust_forwarded: bool = False
    connect_timeout: float = 5.0
    upstream_timeout: float = 60.0
    max_connections: int = 256
    routes: tuple[RoutePolicy, ...] = field(default=())

    def __post_init__(self) -> None:
        coerce_fields(self, PROXY_OPTIONS)
        if not isinstance(self.config, IdempotencyConfig):
            raise ConfigurationError(f"config must be an IdempotencyConfig, got {self.config!r}")
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
        object.__setattr__(self, "principal_header", self.principal_header.lower())
        if self.max_connections < 1:
            raise ConfigurationError("max_connections must be at least 1")
        object.__setattr__(self, "routes", tuple(self.routes))
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
        config = dataclasses.replace(
            self.config, scope_resolver=header_scope_resolver(self.principal_header)
        )
        if route is None or not route.options:
            return config
        return IdempotencyConfig.from_mapping(
            route.options, source=f"route {route.path}", base=config
        )

    def to_json(self) -> str:
        """Serialize (for the worker processes, which rebuild the settings from it).

        Raises:
            ConfigurationError: a function option (``on_event``) that another process cannot
                import by its name.
        """
        data: dict[str, Any] = {name: getattr(self, name) for name in PROXY_OPTIONS}
        data["config"] = {name: _plain(name, getattr(self.config, name)) for name in CONFIG_OPTIONS}
        data["routes"] = [
            {
                "path": route.path,
                "enabled": route.enabled,
                "options": {name: _plain(name, value) for name, value in route.options.items()},
            }
            for route in self.routes
        ]
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> ProxySettings:
        """Rebuild settings written by :meth:`to_json`."""
        data = json.loads(text)
        config = IdempotencyConfig.from_mapping(data.pop("config"), source="the proxy's settings")
        routes = tuple(RoutePolicy(**route) for route in data.pop("routes"))
        return cls(**data, config=config, routes=routes)


def _plain(name: str, value: Any) -> Any:
    """A setting as JSON (read back by the options' own coercions)."""
    if isinstance(value, frozenset):
        return sorted(value)
    if isinstance(value, tuple):
        return list(value)
    if callable(value):
        path = f"{value.__module__}:{value.__qualname__}"
        try:
            found: Any = importlib.import_module(value.__module__)
            for part in value.__qualname__.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError):
            found = None
        if found is not value:
            raise ConfigurationError(
                f"{name}: several workers need a function they can import by name "
                f"(pkg.module:name), not {value!r}"
            )
        return path
    return value


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
