"""The proxy's ASGI app: health and readiness, then one middleware per route policy, then the
forwarder."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import KW_ONLY, dataclass
from typing import Any, cast

from .._core.errors import StoreError
from ..asgi import IdempotencyMiddleware
from ..stores import AsyncStore, resolve_async_store
from ._commit import READY, CommitOnReserve, Ready
from .forward import UpstreamProxy, _problem
from .settings import ProxySettings, RoutePolicy

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Any, Receive, Send], Awaitable[None]]

logger = logging.getLogger("retrysafe.proxy")

HEALTH_PATH = "/-/healthz"
READY_PATH = "/-/readyz"


@dataclass(eq=False)
class _Front:
    """Answers the proxy's own endpoints and hands every other request to its route's stack."""

    proxy: UpstreamProxy
    store: AsyncStore
    default: ASGIApp
    routes: list[tuple[RoutePolicy, ASGIApp]]
    _: KW_ONLY
    #: Take an idle upstream connection before the reservation (see ``_commit``).
    early_commit: bool = False

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
        # The upstream receives the raw path; the ASGI shell identifies a request by it too
        # (retrysafe._core.request.exact_path). Route rules match the decoded path (what an
        # operator writes).
        app = self.default
        for policy, route_app in self.routes:
            if policy.matches(path):
                app = route_app
                break
        if self.early_commit:
            pool = self.proxy.pool()
            conn = pool.take_idle()
            if conn is not None:
                ready = Ready(conn)
                reset = READY.set(ready)
                try:
                    await app(scope, receive, send)
                finally:
                    READY.reset(reset)
                    if ready.conn is not None:  # not forwarded (a replay, a 409...): unused
                        pool.release(ready.conn)
                return
        await app(scope, receive, send)

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


#: The collector's thresholds in a proxy process (CPython's default: 700, 10, 10). Every request
#: allocates a few hundred objects and most die young; at 700 the proxy ran a young collection
#: every few requests, about 20 us of CPU per request in all (timed with ``gc.callbacks`` at 32
#: and 128 connections), 6 us at 10,000.
GC_THRESHOLD = (10_000, 50, 100)


def tune_gc() -> None:
    """Set up the collector of a ``retrysafe proxy`` process (the command calls it, once per
    worker, before serving): what start-up built is moved out of every later collection
    (``gc.freeze``), and young collections run less often (:data:`GC_THRESHOLD`)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


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
    # The mark folded into the reservation: only where the proxy marks at all, on a store that
    # can (see _commit).
    early_commit = settings.on_ambiguous == "unknown" and hasattr(store, "reserve_committed")
    keyed = cast(AsyncStore, CommitOnReserve(store)) if early_commit else store
    default = IdempotencyMiddleware(proxy, store=keyed, config=settings.idempotency_config())
    routes: list[tuple[RoutePolicy, ASGIApp]] = []
    for policy in settings.routes:
        if not policy.enabled:
            routes.append((policy, proxy))
            continue
        config = settings.idempotency_config(policy)
        routes.append((policy, IdempotencyMiddleware(proxy, store=keyed, config=config)))
    return _Front(proxy, store, default, routes, early_commit=early_commit)
