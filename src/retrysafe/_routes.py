"""Per-route settings: the :func:`idempotent` decorator and the lookup the middleware does.

The decorator only marks an endpoint; it needs no framework. The ASGI middleware finds marked
routes through ``scope["app"].routes`` (Starlette and FastAPI set ``scope["app"]`` before their
middleware runs) and matches the request against those routes only.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

from ._config import IdempotencyConfig, RouteOptions, ScopeResolver

__all__ = [
    "ROUTE_OPTIONS_ATTR",
    "RouteTable",
    "find_route_options",
    "idempotent",
    "route_config",
    "route_options",
    "route_template",
]

ROUTE_OPTIONS_ATTR = "__retrysafe_options__"

F = TypeVar("F", bound=Callable[..., Any])


def idempotent(
    *,
    enabled: bool = True,
    required: bool | None = None,
    ttl: float | None = None,
    lease: float | None = None,
    on_conflict: Literal["reject", "wait"] | None = None,
    canonical_json: bool | None = None,
    scope_resolver: ScopeResolver | None = None,
    release_statuses: frozenset[int] | None = None,
) -> Callable[[F], F]:
    """Mark an endpoint with per-route idempotency settings (see :class:`RouteOptions`).

    Example::

        @app.post("/payments")
        @idempotent(required=True, ttl=3600)
        async def pay(...): ...

    Returns:
        A decorator that returns the endpoint unchanged, only marked.
    """
    options = RouteOptions(
        enabled=enabled,
        required=required,
        ttl=ttl,
        lease=lease,
        on_conflict=on_conflict,
        canonical_json=canonical_json,
        scope_resolver=scope_resolver,
        release_statuses=release_statuses,
    )

    def mark(endpoint: F) -> F:
        setattr(endpoint, ROUTE_OPTIONS_ATTR, options)
        return endpoint

    return mark


def route_options(endpoint: Any) -> RouteOptions | None:
    """The options ``@idempotent`` put on an endpoint (a view function), if any."""
    options = getattr(endpoint, ROUTE_OPTIONS_ATTR, None)
    return options if isinstance(options, RouteOptions) else None


def route_config(
    cache: dict[int, IdempotencyConfig], options: RouteOptions | None, base: IdempotencyConfig
) -> IdempotencyConfig | None:
    """``base`` with a route's overrides (merged once per options object, cached in ``cache``),
    or ``None`` when the route opted out (``enabled=False``)."""
    if options is None:
        return base
    if not options.enabled:
        return None
    config = cache.get(id(options))
    if config is None:
        config = cache[id(options)] = base.with_route(options)
    return config


def _marked_routes(routes: Any) -> list[tuple[Any, RouteOptions]]:
    found: list[tuple[Any, RouteOptions]] = []
    for route in routes or ():
        endpoint = getattr(route, "endpoint", None)
        options = getattr(endpoint, ROUTE_OPTIONS_ATTR, None)
        if isinstance(options, RouteOptions) and hasattr(route, "matches"):
            found.append((route, options))
    return found


class RouteTable:
    """Caches, per app object, the routes that carry options, and the settings they give."""

    def __init__(self) -> None:
        self._by_app: dict[int, tuple[int, list[tuple[Any, RouteOptions]]]] = {}
        self._configs: dict[int, IdempotencyConfig] = {}

    def config(self, scope: Mapping[str, Any], base: IdempotencyConfig) -> IdempotencyConfig | None:
        """The settings of this request's route (``base`` with the route's overrides), or
        ``None`` when the route opted out (``enabled=False``)."""
        return route_config(self._configs, self.lookup(scope), base)

    def lookup(self, scope: Mapping[str, Any]) -> RouteOptions | None:
        """Return the options of the marked route this request goes to, if any."""
        app = scope.get("app")
        routes = getattr(app, "routes", None)
        if routes is None:
            return None
        cached = self._by_app.get(id(app))
        if cached is None or cached[0] != len(routes):
            cached = (len(routes), _marked_routes(routes))
            self._by_app[id(app)] = cached
        return find_route_options(cached[1], scope)


def find_route_options(
    marked: list[tuple[Any, RouteOptions]], scope: Mapping[str, Any]
) -> RouteOptions | None:
    """Return the options of the first marked route whose path (and method) matches."""
    for route, options in marked:
        match, _ = route.matches(scope)
        if match.value == 2:  # starlette.routing.Match.FULL
            return options
    return None


def route_template(scope: Mapping[str, Any]) -> str | None:
    """The template of the route a request goes to (``/orders/{id}``), for metric labels.

    Starlette and FastAPI put the matched route in ``scope["route"]`` once routed; before that
    (a replay never reaches the router) the app's routes are matched here. ``None`` when
    unknown: labels must never carry the raw path (unbounded cardinality).
    """
    route = scope.get("route")
    if route is not None:
        template = getattr(route, "path_format", None) or getattr(route, "path", None)
        return template if isinstance(template, str) else None
    app = scope.get("app")
    routes = getattr(app, "routes", None)
    if not routes:
        return None
    # Matching every route costs about a microsecond each: remember the answer per path.
    try:
        templates = _templates.get(app)
        if templates is None:
            templates = _templates[app] = {}
    except TypeError:  # an app that cannot be weakly referenced: no cache
        templates = {}
    cache_key = (len(routes), scope.get("method"), scope.get("path"))
    if cache_key in templates:
        return templates[cache_key]
    found: str | None = None
    for candidate in routes:
        # A Mount's own path is only a prefix of its routes' templates: not a label.
        if getattr(candidate, "routes", None) or not hasattr(candidate, "matches"):
            continue
        try:
            match, _ = candidate.matches(scope)
        except Exception:
            continue
        if getattr(match, "value", 0) == 2:  # starlette.routing.Match.FULL
            template = getattr(candidate, "path_format", None) or getattr(candidate, "path", None)
            found = template if isinstance(template, str) else None
            break
    if len(templates) >= _TEMPLATES_MAX:
        templates.clear()  # raw paths with ids in them must not grow it without bound
    templates[cache_key] = found
    return found


#: app -> ``(route count, method, path)`` -> route template, for :func:`route_template`.
_templates: weakref.WeakKeyDictionary[Any, dict[tuple[int, object, object], str | None]] = (
    weakref.WeakKeyDictionary()
)
_TEMPLATES_MAX = 4096
