"""``retrysafe proxy``: the idempotency contract in front of an HTTP backend in any language.

The app is three layers, outermost first::

    _Front           /-/healthz and /-/readyz (never forwarded); picks the route's policy
    IdempotencyMiddleware (one per route policy, all on one store)
    UpstreamProxy    forwards over a pool of keep-alive HTTP/1.1 connections per process

An upstream that got the request and then gave no answer (read timeout, reset, killed) may have
done the work, so the proxy marks the key committed (:func:`retrysafe.mark_committed`) just before
the first byte leaves: from then on a failure ends in ``409 idempotency-outcome-unknown`` and the
request is never forwarded twice, even if the proxy itself is killed. A failure before anything
was sent (connection refused) releases the key. A complete upstream answer, 5xx included, is
settled by the status policy like any handler's response.
"""

from __future__ import annotations

from .app import HEALTH_PATH, READY_PATH, build_app
from .forward import HOP_BY_HOP, UpstreamProxy
from .settings import ProxySettings, RoutePolicy, header_scope_resolver
from .sources import OPTIONS, load_settings

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
