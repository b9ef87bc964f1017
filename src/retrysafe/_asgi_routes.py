"""Route matching for the ASGI shell: which ``@idempotent`` route a request goes to.

The routes come from the app the middleware wraps: the first object down its ``.app`` chain
(the attribute every Starlette middleware keeps) that has ``.routes``, found once at start-up, so
the middleware wrapped around a Starlette or FastAPI app (``app = IdempotencyMiddleware(app,
...)``) sees them as well as one placed inside the app's own stack. Failing that, the app in
``scope["app"]``, which Starlette and FastAPI set before their own middleware runs. The marked
routes of an app are kept once (cached per app), and a request is matched against those alone
with the routes' own ``matches(scope)``. Routes under a ``Mount`` (a sub-app or a list of routes
under a path prefix, also FastAPI's ``app.mount``) are found too: the request is matched against
the mount first, then against the route with the scope the mount gives its children. An app
without routes costs nothing.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

from ._core.config import IdempotencyConfig, RouteOptions
from ._core.routes import ROUTE_OPTIONS_ATTR, route_config

__all__ = ["RouteTable", "find_route_options", "route_template", "routes_owner"]


#: A marked route and the mounts in front of it (outermost first), and the options it carries.
Marked = tuple[tuple[Any, ...], Any, RouteOptions]

#: How deep :func:`_marked_routes` follows mounts inside mounts.
_MOUNT_DEPTH = 8


def _marked_routes(routes: Any, mounts: tuple[Any, ...] = ()) -> list[Marked]:
    found: list[Marked] = []
    for route in routes or ():
        children = _mounted_routes(route)
        if children is not None:
            if len(mounts) < _MOUNT_DEPTH:
                found.extend(_marked_routes(children, (*mounts, route)))
            continue
        endpoint = getattr(route, "endpoint", None)
        options = getattr(endpoint, ROUTE_OPTIONS_ATTR, None)
        if isinstance(options, RouteOptions) and hasattr(route, "matches"):
            found.append((mounts, route, options))
    return found


def _mounted_routes(route: Any) -> list[Any] | None:
    """The routes under a ``Mount`` (or ``Host``), or ``None`` for any other route."""
    if not hasattr(route, "matches") or hasattr(route, "endpoint"):
        return None
    try:
        children = getattr(route, "routes", None)
    except Exception:  # a mounted app whose routes cannot be read: nothing to match
        return None
    return children if isinstance(children, list) and children else None


def _full_match(mounts: tuple[Any, ...], route: Any, scope: Mapping[str, Any]) -> bool:
    """Whether ``route``, behind ``mounts``, takes this request (``Match.FULL`` all the way)."""
    for mount in mounts:
        match, child = mount.matches(scope)
        if getattr(match, "value", 0) != 2:  # starlette.routing.Match.FULL
            return False
        scope = {**scope, **child}
    match, _ = route.matches(scope)
    return getattr(match, "value", 0) == 2


#: How far down a chain of wrapping middleware :func:`routes_owner` looks.
_CHAIN_DEPTH = 32


def routes_owner(app: Any) -> Any:
    """The app whose routes a middleware wrapped around ``app`` matches requests against.

    Args:
        app: the ASGI app the middleware wraps.

    Returns:
        ``app``, or the first object down its chain of ``.app`` attributes, that has a list of
        ``routes`` (a Starlette or FastAPI app's router, or a router); ``None`` when there is
        none.
    """
    for _ in range(_CHAIN_DEPTH):
        if app is None:
            return None
        try:
            routes = getattr(app, "routes", None)
        except Exception:  # a property that cannot answer yet: not an app with routes
            routes = None
        if isinstance(routes, list):
            # A Starlette or FastAPI app's routes are a property over its router's list: the
            # router itself is read faster, on every request.
            router = getattr(app, "router", None)
            return router if getattr(router, "routes", None) is routes else app
        app = getattr(app, "app", None)
    return None


class RouteTable:
    """Caches, per app object, the routes that carry options, and the settings they give.

    Args:
        owner: the app whose routes to match (see :func:`routes_owner`); ``None``: the app in
            each request's ``scope["app"]``.
    """

    def __init__(self, owner: Any = None) -> None:
        self._owner = owner
        self._by_app: dict[int, tuple[int, list[Marked]]] = {}
        self._configs: dict[int, IdempotencyConfig] = {}

    def config(self, scope: Mapping[str, Any], base: IdempotencyConfig) -> IdempotencyConfig | None:
        """The settings of this request's route (``base`` with the route's overrides), or
        ``None`` when the route opted out (``enabled=False``)."""
        marked = self._marked(scope)
        if not marked:  # no marked route (the common case): no call more
            return base
        return route_config(self._configs, find_route_options(marked, scope), base)

    def lookup(self, scope: Mapping[str, Any]) -> RouteOptions | None:
        """Return the options of the marked route this request goes to, if any."""
        marked = self._marked(scope)
        return find_route_options(marked, scope) if marked else None

    def _marked(self, scope: Mapping[str, Any]) -> list[Marked] | None:
        app = self._owner if self._owner is not None else scope.get("app")
        routes = getattr(app, "routes", None)
        if routes is None:
            return None
        cached = self._by_app.get(id(app))
        if cached is None or cached[0] != len(routes):
            cached = (len(routes), _marked_routes(routes))
            self._by_app[id(app)] = cached
        return cached[1]

    def template(self, scope: Mapping[str, Any]) -> str | None:
        """:func:`route_template` over this table's app."""
        return route_template(scope, self._owner)


def find_route_options(marked: list[Marked], scope: Mapping[str, Any]) -> RouteOptions | None:
    """Return the options of the first marked route whose path (and method) matches."""
    for mounts, route, options in marked:
        if mounts:
            if _full_match(mounts, route, scope):
                return options
            continue
        match, _ = route.matches(scope)
        if match.value == 2:  # starlette.routing.Match.FULL
            return options
    return None


def route_template(scope: Mapping[str, Any], owner: Any = None) -> str | None:
    """The template of the route a request goes to (``/orders/{id}``), for metric labels.

    Starlette and FastAPI put the matched route in ``scope["route"]`` once routed; before that
    (a replay never reaches the router) the routes of ``owner`` (else of ``scope["app"]``) are
    matched here. ``None`` when unknown: labels must never carry the raw path (unbounded
    cardinality).
    """
    route = scope.get("route")
    if route is not None:
        template = getattr(route, "path_format", None) or getattr(route, "path", None)
        return template if isinstance(template, str) else None
    app = owner if owner is not None else scope.get("app")
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
    found = _template_in(routes, scope, "", 0)
    if len(templates) >= _TEMPLATES_MAX:
        templates.clear()  # raw paths with ids in them must not grow it without bound
    templates[cache_key] = found
    return found


def _template_in(routes: Any, scope: Mapping[str, Any], prefix: str, depth: int) -> str | None:
    """The template of the route in ``routes`` that takes this request, behind ``prefix``."""
    for candidate in routes:
        if not hasattr(candidate, "matches"):
            continue
        try:
            match, child = candidate.matches(scope)
        except Exception:
            continue
        if getattr(match, "value", 0) != 2:  # starlette.routing.Match.FULL
            continue
        children = _mounted_routes(candidate)
        if children is not None:
            # A Mount's own path (``/v1``, not its ``/v1/{path}`` format) prefixes its routes'.
            mounted = getattr(candidate, "path", None)
            if depth >= _MOUNT_DEPTH or not isinstance(mounted, str):
                return None
            return _template_in(children, {**scope, **child}, prefix + mounted, depth + 1)
        template = getattr(candidate, "path_format", None) or getattr(candidate, "path", None)
        return prefix + template if isinstance(template, str) else None
    return None


#: app -> ``(route count, method, path)`` -> route template, for :func:`route_template`.
_templates: weakref.WeakKeyDictionary[Any, dict[tuple[int, object, object], str | None]] = (
    weakref.WeakKeyDictionary()
)
_TEMPLATES_MAX = 4096
