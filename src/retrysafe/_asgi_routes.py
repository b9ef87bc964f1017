"""Route matching for the ASGI shell: which ``@idempotent`` route a request goes to.

Starlette and FastAPI set ``scope["app"]`` before their middleware runs, so the middleware reads
``scope["app"].routes`` once per app (cached), keeps the marked routes, and matches the request
against those alone with the routes' own ``matches(scope)``.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

from ._core.config import IdempotencyConfig, RouteOptions
from ._core.routes import ROUTE_OPTIONS_ATTR, route_config

__all__ = ["RouteTable", "find_route_options", "route_template"]


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
