"""The ASGI apps that `make bench` serves: one ``POST /orders`` endpoint, bare or protected.

Run one app per process (``bench/run.py`` does this)::

    python bench/apps.py --app retrysafe --store memory:// --port 8101 --cpu 0

The bare endpoint parses a small JSON body and answers ``201`` JSON with a ``Location`` header.
The protected variants put an idempotency layer in front of the very same endpoint, installed as
users install it (``Starlette(middleware=[...])``):

- ``retrysafe``: :class:`retrysafe.asgi.IdempotencyMiddleware` with a store URL.
- ``lean``: the lean-prototype baseline of ``bench/lean.py`` on the same store URL.
- ``wsgi-bare``, ``wsgi-retrysafe``, ``wsgi-lean``: the same endpoint as a plain WSGI app, bare,
  behind :class:`retrysafe.wsgi.IdempotencyMiddleware`, or behind the lean WSGI prototype
  (memory only), served by gunicorn (1 worker, ``gthread``).
- ``idemkit``, ``fastapi-idempotency-key``, ``asgi-idempotency-header``: the peers, imported from
  the separate bench virtualenv (``bench/.venv-bench-peers``), each on Redis.

Imports are lazy so this file runs under the main venv (no peers) and the peers venv (no
retrysafe) alike. ``BENCH_PROFILE=/path.prof`` profiles the server with cProfile for its whole
life and writes the stats on shutdown (SIGINT/SIGTERM).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from typing import Any

APPS = (
    "bare",
    "retrysafe",
    "lean",
    "wsgi-bare",
    "wsgi-retrysafe",
    "wsgi-lean",
    "idemkit",
    "fastapi-idempotency-key",
    "asgi-idempotency-header",
)


def _endpoint() -> Any:
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    ids = itertools.count(1)

    async def create_order(request: Request) -> JSONResponse:
        data = await request.json()
        order_id = next(ids)
        body = {"id": order_id, "item": data["item"], "quantity": data["quantity"]}
        return JSONResponse(body, status_code=201, headers={"Location": f"/orders/{order_id}"})

    return create_order


def _starlette(middleware: list[Any]) -> Any:
    from starlette.applications import Starlette
    from starlette.routing import Route

    return Starlette(
        routes=[Route("/orders", _endpoint(), methods=["POST"])], middleware=middleware
    )


def wsgi_endpoint() -> Any:
    """The bare endpoint as a WSGI app (no framework: the WSGI bare is the WSGI server alone)."""
    ids = itertools.count(1)

    def create_order(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        data = json.loads(environ["wsgi.input"].read(length))
        order_id = next(ids)
        body = json.dumps({"id": order_id, "item": data["item"], "quantity": data["quantity"]})
        out = body.encode()
        start_response(
            "201 Created",
            [
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(out))),
                ("Location", f"/orders/{order_id}"),
            ],
        )
        return [out]

    return create_order


def build_wsgi_app(name: str, store: str = "") -> Any:
    """Return the WSGI app ``name`` (``wsgi-bare``, ``wsgi-retrysafe``, ``wsgi-lean``)."""
    if name == "wsgi-bare":
        return wsgi_endpoint()
    if name == "wsgi-retrysafe":
        from retrysafe.wsgi import IdempotencyMiddleware

        return IdempotencyMiddleware(wsgi_endpoint(), store=store)
    from lean import LeanWSGI

    return LeanWSGI(wsgi_endpoint())


def build_app(name: str, store: str = "", prefix: str = "") -> Any:
    """Return the ASGI app ``name`` (see :data:`APPS`).

    Args:
        name: which app.
        store: the retrysafe store URL, or the Redis URL of a peer.
        prefix: the Redis key prefix of a peer (retrysafe takes it in the URL).
    """
    from starlette.middleware import Middleware

    if name == "bare":
        return _starlette([])
    if name == "retrysafe":
        from retrysafe.asgi import IdempotencyMiddleware

        return _starlette([Middleware(IdempotencyMiddleware, store=store)])
    if name == "lean":
        from lean import LeanASGI

        return _starlette([Middleware(LeanASGI, store=store)])
    if name == "idemkit":
        # Closest to retrysafe's defaults: fingerprint over method, path, query and raw body;
        # 30 s lease, 24 h retention, fail closed, no in-process replay cache (retrysafe has
        # none), 422 on mismatch / 409 in progress. Single-tenant on purpose (no auth here).
        from idemkit import HttpConfig, IdempotencyMiddleware, RedisBackend

        backend = RedisBackend.from_url(store, namespace=prefix)
        config = HttpConfig(
            scope_mode="single_tenant",
            lease_ttl_seconds=30.0,
            expires_after_seconds=86_400.0,
            use_local_cache=False,
        )
        return _starlette([Middleware(IdempotencyMiddleware, backend=backend, config=config)])
    if name == "fastapi-idempotency-key":
        from fastapi_idempotency_key import IdempotencyMiddleware, RedisBackend

        backend = RedisBackend(redis_url=store, prefix=prefix)
        return _starlette(
            [
                Middleware(
                    IdempotencyMiddleware,
                    backend=backend,
                    enforce_methods=("POST", "PATCH"),
                    default_ttl=86_400,
                )
            ]
        )
    if name == "asgi-idempotency-header":
        from idempotency_header_middleware import IdempotencyHeaderMiddleware
        from idempotency_header_middleware.backends.redis import RedisBackend
        from redis.asyncio import Redis

        backend = RedisBackend(
            Redis.from_url(store),
            keys_key=f"{prefix}keys",
            response_key=f"{prefix}responses:",
            expiry=86_400,
        )
        return _starlette([Middleware(IdempotencyHeaderMiddleware, backend=backend)])
    raise SystemExit(f"unknown app {name!r}; choose from {', '.join(APPS)}")


def _serve(app: Any, port: int) -> None:
    import uvicorn

    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        workers=1,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
        lifespan="off",
        backlog=2048,
    )


def _serve_wsgi(app: Any, port: int) -> None:
    from gunicorn.app.base import BaseApplication

    class _Server(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            for key, value in {
                "bind": f"127.0.0.1:{port}",
                "workers": 1,
                "worker_class": "gthread",
                "threads": 4,
                "keepalive": 30,
                "loglevel": "warning",
                "accesslog": None,
                "backlog": 2048,
            }.items():
                self.cfg.set(key, value)

        def load(self) -> Any:
            return app

    _Server().run()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--app", required=True, choices=APPS)
    parser.add_argument("--store", default="")
    parser.add_argument("--prefix", default="")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cpu", type=int, default=None, help="pin the server to this core")
    args = parser.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    if args.app.startswith("wsgi-"):
        _serve_wsgi(build_wsgi_app(args.app, args.store), args.port)
        return
    app = build_app(args.app, args.store, args.prefix)
    profile_path = os.environ.get("BENCH_PROFILE")
    if not profile_path:
        _serve(app, args.port)
        return
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        _serve(app, args.port)
    finally:
        profiler.disable()
        profiler.dump_stats(profile_path)
        print(f"profile written to {profile_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
