"""Per-route settings: the :func:`idempotent` decorator and the merge of a route's options.

The decorator only marks an endpoint; it needs no framework. Each shell finds the marked
endpoint its own way (the ASGI shell in :mod:`retrysafe._asgi_routes`, Flask through its URL
map, Django through the resolved view) and merges its options here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeVar

from .config import IdempotencyConfig, RouteOptions, ScopeResolver

__all__ = [
    "ROUTE_OPTIONS_ATTR",
    "idempotent",
    "route_config",
    "route_options",
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
