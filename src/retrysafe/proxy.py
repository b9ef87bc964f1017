"""``retrysafe proxy``: the idempotency contract in front of an HTTP backend in any language.

The app is three layers, outermost first::

    _Front           /-/healthz and /-/readyz (never forwarded); picks the route's policy
    IdempotencyMiddleware (one per route policy, all on one store)
    UpstreamProxy    forwards with one pooled httpx.AsyncClient per process

An upstream that got the request and then gave no answer (read timeout, reset, killed) may have
done the work, so the proxy marks the key committed (:func:`retrysafe.mark_committed`) just before
the first byte leaves: from then on a failure ends in ``409 idempotency-outcome-unknown`` and the
request is never forwarded twice, even if the proxy itself is killed. A failure before anything
was sent (connection refused) releases the key. A complete upstream answer, 5xx included, is
settled by the status policy like any handler's response.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import tomllib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from ._config import IdempotencyConfig, ScopeResolver
from ._errors import ConfigurationError, StoreError
from ._problems import render_problem
from ._scope import authorization_scope
from ._transaction import CONTEXT_SCOPE_KEY, mark_committed, outcome_known
from .asgi import IdempotencyMiddleware
from .stores import AsyncStore, resolve_async_store

if TYPE_CHECKING:
    import httpx

__all__ = [
    "HEALTH_PATH",
    "HOP_BY_HOP",
    "OPTIONS",
    "READY_PATH",
    "ProxySettings",
    "RoutePolicy",
    "UpstreamProxy",
    "build_app",
    "header_scope_resolver",
    "load_settings",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Any, Receive, Send], Awaitable[None]]

logger = logging.getLogger("retrysafe.proxy")

HEALTH_PATH = "/-/healthz"
READY_PATH = "/-/readyz"

#: RFC 9110 section 7.6.1 connection-specific fields (plus the legacy ones still seen), never
#: forwarded in either direction; fields named in ``Connection`` are dropped too.
HOP_BY_HOP: frozenset[bytes] = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        # The proxy does not relay 100-continue: it reads the body itself.
        b"expect",
    }
)
_FORWARDING: frozenset[bytes] = frozenset(
    {b"forwarded", b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host", b"x-real-ip"}
)
#: How long an idle pooled upstream connection is kept. Shorter than the usual server keep-alive
#: (uvicorn, Node.js: 5 s): an upstream closing an idle connection while the proxy writes on it
#: would turn an innocent request into an ambiguous one.
_KEEPALIVE_EXPIRY = 2.0
_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")

# -- settings ------------------------------------------------------------------------------------


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


# -- where options come from: flags, then RETRYSAFE_* variables, then the TOML file -------------

#: option -> (kind, environment variable, default; ``...``: required). Flags are ``--option-name``.
OPTIONS: dict[str, tuple[str, str, Any]] = {
    "listen": ("str", "RETRYSAFE_LISTEN", "127.0.0.1:8080"),
    "upstream": ("str", "RETRYSAFE_UPSTREAM", ...),
    "store": ("str", "RETRYSAFE_STORE_URL", ...),
    "workers": ("int", "RETRYSAFE_WORKERS", 1),
    "log_level": ("str", "RETRYSAFE_LOG_LEVEL", "info"),
    "methods": ("methods", "RETRYSAFE_METHODS", frozenset({"POST", "PATCH"})),
    "required": ("bool", "RETRYSAFE_REQUIRED", False),
    "ttl": ("float", "RETRYSAFE_TTL", 24 * 3600.0),
    "lease": ("float", "RETRYSAFE_LEASE", 30.0),
    "max_body_size": ("int", "RETRYSAFE_MAX_BODY_SIZE", 1024 * 1024),
    "max_stored_body_size": ("int", "RETRYSAFE_MAX_STORED_BODY_SIZE", 1024 * 1024),
    "on_conflict": ("str", "RETRYSAFE_ON_CONFLICT", "reject"),
    "store_server_errors": ("bool", "RETRYSAFE_STORE_SERVER_ERRORS", False),
    "on_ambiguous": ("str", "RETRYSAFE_ON_AMBIGUOUS", "unknown"),
    "principal_header": ("str", "RETRYSAFE_PRINCIPAL_HEADER", "authorization"),
    "trust_forwarded": ("bool", "RETRYSAFE_TRUST_FORWARDED", False),
    "connect_timeout": ("float", "RETRYSAFE_CONNECT_TIMEOUT", 5.0),
    "upstream_timeout": ("float", "RETRYSAFE_UPSTREAM_TIMEOUT", 60.0),
    "max_connections": ("int", "RETRYSAFE_MAX_CONNECTIONS", 100),
}

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


def load_settings(
    flags: Mapping[str, Any],
    environ: Mapping[str, str],
    config_path: str | None = None,
) -> ProxySettings:
    """Merge the sources of every option: a flag wins over ``RETRYSAFE_*``, which wins over
    the config file, which wins over the default.

    Args:
        flags: option -> value from the command line (``None``: not given).
        environ: the environment (the caller passes ``os.environ``).
        config_path: a TOML file with top-level options and ``[[routes]]`` tables.

    Returns:
        Validated settings.

    Raises:
        ConfigurationError: an unreadable file, an unknown or bad option, a missing one.
    """
    file_values: dict[str, Any] = {}
    routes: tuple[RoutePolicy, ...] = ()
    if config_path:
        try:
            file_values = tomllib.loads(Path(config_path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigurationError(f"cannot read {config_path}: {exc.strerror}") from exc
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"{config_path} is not valid TOML: {exc}") from exc
        raw_routes = file_values.pop("routes", [])
        if not isinstance(raw_routes, list):
            raise ConfigurationError(f"{config_path}: routes must be [[routes]] tables")
        routes = tuple(_route(r, config_path) for r in raw_routes)
        unknown = set(file_values) - set(OPTIONS)
        if unknown:
            raise ConfigurationError(f"{config_path}: unknown option {sorted(unknown)[0]!r}")
    values: dict[str, Any] = {}
    for name, (kind, variable, default) in OPTIONS.items():
        if flags.get(name) is not None:
            values[name] = _convert(name, kind, flags[name], f"--{name.replace('_', '-')}")
        elif environ.get(variable):
            values[name] = _convert(name, kind, environ[variable], variable)
        elif name in file_values:
            values[name] = _convert(name, kind, file_values[name], config_path or "")
        elif default is ...:
            flag = f"--{name.replace('_', '-')}"
            raise ConfigurationError(f"{flag} is required (or set {variable})")
        else:
            values[name] = default
    return ProxySettings(**values, routes=routes)


# -- principal scoping ---------------------------------------------------------------------------


def header_scope_resolver(header: str) -> ScopeResolver:
    """Scope keys by the value of one request header (a hash of it; global when absent).

    The hash is the one of the ``Authorization`` default, so ``retrysafe resolve
    --authorization '<header value>'`` finds a key whatever header is configured.

    Args:
        header: the header name, e.g. ``authorization`` or ``x-api-key``.

    Returns:
        A ``scope_resolver`` for :class:`~retrysafe.IdempotencyConfig`.
    """
    raw = header.lower().encode("latin-1")

    def resolve(request: Any) -> str:
        # Given the ASGI scope today; the neutral request head (``.headers``: byte pairs) once
        # the flow rewrite lands: both carry lower-case (name, value) byte pairs.
        pairs = request.get("headers", ()) if isinstance(request, Mapping) else request.headers
        values = [value for name, value in pairs if name == raw]
        if not values:
            return ""
        return authorization_scope(values[0] if len(values) == 1 else b", ".join(values))

    return resolve


# -- forwarding ----------------------------------------------------------------------------------


class _MarkFailed(Exception):
    """The store could not record the mark: the request must not leave."""


class _ClientGone(Exception):
    """The client went away while its request body streamed."""


class UpstreamProxy:
    """ASGI app that forwards every HTTP request to the upstream and streams the answer back.

    Args:
        settings: the proxy settings.

    Raises:
        ConfigurationError: httpx is not installed.
    """

    def __init__(self, settings: ProxySettings) -> None:
        try:
            import httpx
        except ImportError as exc:  # pragma: no cover - the extra is installed in tests
            raise ConfigurationError(
                f"retrysafe proxy needs: pip install 'retrysafe[proxy]' ({exc})"
            ) from exc
        # Kept as attributes: httpx stays an optional import of this module.
        self._request_cls: type[httpx.Request] = httpx.Request
        self._client_cls: type[httpx.AsyncClient] = httpx.AsyncClient
        self._http_error: type[httpx.HTTPError] = httpx.HTTPError
        self._timeout_error: type[httpx.TimeoutException] = httpx.TimeoutException
        self.settings = settings
        upstream = httpx.URL(settings.upstream)
        self._origin = upstream.copy_with(raw_path=b"/")
        self._base_path = upstream.raw_path.rstrip(b"/")
        self._timeout = httpx.Timeout(
            settings.upstream_timeout,
            connect=settings.connect_timeout,
            pool=settings.connect_timeout,
        )
        self._limits = httpx.Limits(
            max_connections=settings.max_connections,
            max_keepalive_connections=settings.max_connections,
            keepalive_expiry=_KEEPALIVE_EXPIRY,
        )
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def client(self) -> httpx.AsyncClient:
        """The pooled client of the running event loop (one per worker process)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = self._client_cls(
                timeout=self._timeout, limits=self._limits, follow_redirects=False
            )
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the pooled connections."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # websockets are not proxied; uvicorn answers 403 to an unaccepted one
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        first: bytes = message.get("body", b"")
        content: bytes | AsyncIterator[bytes] = first
        if message.get("more_body", False):
            content = _stream_body(first, receive)
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
        query: bytes = scope.get("query_string", b"")
        request = self._request_cls(
            scope["method"],
            self._origin.copy_with(
                raw_path=self._base_path + raw_path + (b"?" + query if query else b"")
            ),
            headers=self._request_headers(scope),
            content=content,
        )
        protected = scope.get(CONTEXT_SCOPE_KEY) is not None
        mark = protected and self.settings.on_ambiguous == "unknown"
        sent = False

        async def trace(event: str, info: Mapping[str, Any]) -> None:
            # httpx's documented "trace" request extension; the event names are httpcore's
            # (tests/proxy kill upstreams and proxies to catch a rename).
            nonlocal sent
            if event.endswith(".send_request_headers.started"):
                # The last moment before the upstream may see the request: mark first, so that
                # not even a SIGKILL of this process can lead to a second forward.
                if mark and not await mark_committed(scope):
                    raise _MarkFailed
                sent = True

        request.extensions["trace"] = trace
        try:
            response = await self.client().send(request, stream=True)
        except _MarkFailed:
            outcome_known(scope)  # nothing was sent: release the key
            await _problem(
                send,
                "idempotency-store-unavailable",
                "The idempotency store cannot be reached; the request was not forwarded.",
                retry_after=1,
            )
            return
        except _ClientGone:
            return
        except self._http_error as exc:
            await self._failed(send, exc, sent=sent, protected=protected)
            return
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": _strip_hop_by_hop(response.headers.raw),
                }
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except self._http_error as exc:
            # The status line has left: the client sees a cut-off response (uvicorn closes the
            # connection) and the key stays marked, so a retry is told the outcome is unknown.
            logger.warning(
                "upstream answer to %s %s broke off: %r", scope["method"], scope["path"], exc
            )
            return
        except OSError:
            return  # the client went away (unprotected request: nothing to capture)
        finally:
            await response.aclose()
        outcome_known(scope)  # a full answer: its status decides, not the mark
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _request_headers(self, scope: Scope) -> list[tuple[bytes, bytes]]:
        raw_headers: list[tuple[bytes, bytes]] = scope["headers"]
        trust = self.settings.trust_forwarded
        dropped = _connection_tokens(raw_headers)
        headers: list[tuple[bytes, bytes]] = []
        host = b""
        prior: dict[bytes, list[bytes]] = {}
        for name, value in raw_headers:
            if name in HOP_BY_HOP or name in dropped:
                continue
            if name == b"host":
                host = value  # the upstream gets its own Host; the original goes in Forwarded
                continue
            if name in _FORWARDING:
                if trust:
                    prior.setdefault(name, []).append(value)
                    if name == b"x-real-ip":
                        headers.append((name, value))
                continue
            headers.append((name, value))
        proto = str(scope.get("scheme", "http")).encode("latin-1")
        client = scope.get("client")
        node = str(client[0]) if client else "unknown"
        quoted = f'"[{node}]"' if ":" in node else node
        element = b"for=" + quoted.encode("latin-1") + b";proto=" + proto
        if host:
            element += b';host="' + host.replace(b'"', b"") + b'"'
        headers.append((b"forwarded", b", ".join([*prior.get(b"forwarded", []), element])))
        chain = [*prior.get(b"x-forwarded-for", []), node.encode("latin-1")]
        headers.append((b"x-forwarded-for", b", ".join(chain)))
        headers.append((b"x-forwarded-proto", prior.get(b"x-forwarded-proto", [proto])[0]))
        if host or b"x-forwarded-host" in prior:
            headers.append((b"x-forwarded-host", prior.get(b"x-forwarded-host", [host])[0]))
        return headers

    async def _failed(self, send: Send, exc: Exception, *, sent: bool, protected: bool) -> None:
        """Answer a failed forward with problem+json: 504 for timeouts, else 502."""
        timeout = isinstance(exc, self._timeout_error)
        logger.warning("upstream %s failed: %r", "request" if sent else "connection", exc)
        if not sent:
            # Nothing reached the upstream: the middleware releases the key (5xx), so the
            # same key may simply be retried.
            await _problem(
                send,
                "upstream-timeout" if timeout else "upstream-unreachable",
                f"The upstream could not be reached ({type(exc).__name__}); nothing was sent. "
                "Retry with the same Idempotency-Key.",
            )
            return
        detail = (
            f"The request was sent to the upstream but no answer came back "
            f"({type(exc).__name__}): it may have taken effect."
        )
        if protected and self.settings.on_ambiguous == "unknown":
            detail += (
                " It is never forwarded twice: retries with this Idempotency-Key get 409 "
                "idempotency-outcome-unknown until an operator resolves the key."
            )
        await _problem(send, "upstream-timeout" if timeout else "upstream-no-answer", detail)


async def _stream_body(first: bytes, receive: Receive) -> AsyncIterator[bytes]:
    """The client's request body, chunk by chunk, as it arrives (never buffered whole)."""
    if first:
        yield first
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


def _connection_tokens(headers: list[tuple[bytes, bytes]]) -> set[bytes]:
    tokens: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            tokens.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return tokens


def _strip_hop_by_hop(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    dropped = _connection_tokens(headers)
    kept = []
    for name, value in headers:
        lname = name.lower()
        if lname not in HOP_BY_HOP and lname not in dropped:
            kept.append((lname, value))
    return kept


async def _problem(send: Send, slug: str, detail: str, *, retry_after: int | None = None) -> None:
    status, headers, body = render_problem(
        slug, detail, type_base="urn:retrysafe:problem:", retry_after=retry_after
    )
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


# -- the front: health, readiness, routing -------------------------------------------------------


class _Front:
    """Answers the proxy's own endpoints and hands every other request to its route's stack."""

    def __init__(
        self,
        proxy: UpstreamProxy,
        store: AsyncStore,
        default: ASGIApp,
        routes: list[tuple[RoutePolicy, ASGIApp]],
    ) -> None:
        self.proxy = proxy
        self.store = store
        self.default = default
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
            return
        if kind != "http":
            await self.proxy(scope, receive, send)
            return
        path: str = scope["path"]
        if path == HEALTH_PATH:
            await _json(send, 200, {"status": "ok"})
            return
        if path == READY_PATH:
            await self._ready(send)
            return
        for policy, app in self.routes:
            if policy.matches(path):
                await app(scope, receive, send)
                return
        await self.default(scope, receive, send)

    async def _ready(self, send: Send) -> None:
        try:
            await asyncio.wait_for(self.store.get("retrysafe-proxy-readiness-probe"), 5.0)
        except (StoreError, OSError, TimeoutError) as exc:
            logger.warning("readiness: store unreachable: %s", exc)
            await _problem(
                send,
                "idempotency-store-unavailable",
                "The idempotency store cannot be reached.",
                retry_after=1,
            )
            return
        await _json(send, 200, {"status": "ready", "store": "ok"})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.proxy.aclose()
                try:
                    await self.store.aclose()
                except StoreError as exc:
                    logger.warning("closing the store failed: %s", exc)
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _json(send: Send, status: int, payload: Mapping[str, Any]) -> None:
    body = json.dumps(payload).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def build_app(settings: ProxySettings) -> ASGIApp:
    """Build the proxy's ASGI app: health endpoints, then idempotency, then the forwarder.

    Every route policy gets its own middleware over the one shared store, so per-route policy
    needs nothing from the upstream (no framework routes to read options from).

    Args:
        settings: validated settings.

    Returns:
        The ASGI app (serve it with uvicorn; it handles the lifespan protocol).

    Raises:
        ConfigurationError: a bad store URL, a missing extra.
    """
    store = resolve_async_store(settings.store)
    proxy = UpstreamProxy(settings)
    default = IdempotencyMiddleware(proxy, store=store, config=settings.idempotency_config())
    routes: list[tuple[RoutePolicy, ASGIApp]] = []
    for policy in settings.routes:
        if not policy.enabled:
            routes.append((policy, proxy))
            continue
        config = settings.idempotency_config(policy)
        routes.append((policy, IdempotencyMiddleware(proxy, store=store, config=config)))
    return _Front(proxy, store, default, routes)
