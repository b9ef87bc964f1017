"""Per-route settings: the :func:`idempotent` decorator and the merge of a route's options.

The decorator only marks an endpoint; it needs no framework. Each shell finds the marked
endpoint its own way (the ASGI shell in :mod:`retrysafe._asgi_routes`, Flask through its URL
map, Django through the resolved view) and merges its options here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypedDict, TypeVar, Unpack

from .config import IdempotencyConfig, RouteOptions, ScopeResolver
from .options import ConfigSource

__all__ = [
    "ROUTE_OPTIONS_ATTR",
    "RouteKeywords",
    "idempotent",
    "route_config",
    "route_options",
]

ROUTE_OPTIONS_ATTR = "__retrysafe_options__"

F = TypeVar("F", bound=Callable[..., Any])

_DECORATOR = ConfigSource.keywords("@idempotent")


class RouteKeywords(TypedDict, total=False):
    """The keyword options of :func:`idempotent`: the fields of :class:`RouteOptions`."""

    enabled: bool
    required: bool | None
    ttl: float | None
    lease: float | None
    on_conflict: Literal["reject", "wait"] | None
    canonical_json: bool | None
    scope_resolver: ScopeResolver | None
    release_statuses: frozenset[int] | None


def idempotent(**options: Unpack[RouteKeywords]) -> Callable[[F], F]:
    """Mark an endpoint with per-route idempotency settings (see :class:`RouteOptions`).

    Example::

        @app.post("/payments")
        @idempotent(required=True, ttl=3600)
        async def pay(...): ...

    Args:
        **options: fields of :class:`RouteOptions`, checked as every front's options are;
            ``None`` keeps the app-wide setting.

    Returns:
        A decorator that returns the endpoint unchanged, only marked.

    Raises:
        ConfigurationError: an unknown option (with "did you mean") or a bad value, naming it
            (``@idempotent(ttl=...): must be positive``), where the decorator is applied.
    """
    given = {name: value for name, value in options.items() if value is not None}
    marks = RouteOptions.from_mapping(given, source=_DECORATOR)

    def mark(endpoint: F) -> F:
        setattr(endpoint, ROUTE_OPTIONS_ATTR, marks)
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
