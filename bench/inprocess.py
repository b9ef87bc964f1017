"""In-process cost of the middleware: CPU microseconds per request, no server, no network.

The very ASGI app that ``bench/apps.py`` serves (a Starlette ``POST /orders`` endpoint) is driven
directly through its ASGI callable, bare and behind the middleware (new key, replay, no key; the
memory store, and a store that does nothing so only the middleware's own work is left). The
middleware takes the path it takes under uvicorn (``detach_handler="never"``: uvicorn never
cancels a request, so no handler task is made). The WSGI
middleware is measured the same way around a bare WSGI endpoint. Each figure is the median of
``--repeat`` runs of ``--requests`` requests, in the same process and run::

    python bench/inprocess.py --requests 20000 --repeat 5 [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from apps import build_app
from lean import LeanASGI, LeanWSGI

from retrysafe.stores import AsyncMemoryStore, MemoryStore, Record, Reservation

BODY = b'{"item":"book","quantity":1}'


class NullStore:
    """A store that does nothing: every reserve wins, every write succeeds."""

    inline_safe = True

    def reserve(self, record_id: str, fingerprint: str, *, lease: float, ttl: float) -> Reservation:
        return Reservation(token="t")

    def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        return True

    def renew(self, record_id: str, token: str, *, lease: float) -> bool:
        return True

    def release(self, record_id: str, token: str) -> bool:
        return True

    def mark_committed(self, record_id: str, token: str, *, lease: float) -> bool:
        return True

    def delete(self, record_id: str) -> bool:
        return True

    def get(self, record_id: str) -> Record | None:
        return None

    def purge_expired(self) -> int:
        return 0

    def close(self) -> None:
        pass


def _asgi_scope(key: bytes | None) -> dict[str, Any]:
    headers = [
        (b"host", b"bench"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(BODY)).encode()),
    ]
    if key is not None:
        headers.append((b"idempotency-key", key))
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/orders",
        "raw_path": b"/orders",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }


def _asgi_cpu_us(app: Any, keys: Callable[[int], bytes | None], n: int) -> float:
    message = {"type": "http.request", "body": BODY, "more_body": False}

    async def receive() -> dict[str, Any]:
        return message

    async def send(_: Any) -> None:
        return None

    async def run() -> float:
        await app(_asgi_scope(keys(-1)), receive, send)  # warm up (routes, first reservation)
        scopes = [_asgi_scope(keys(i)) for i in range(n)]
        start = time.process_time()
        for scope in scopes:
            await app(scope, receive, send)
        return (time.process_time() - start) * 1e6 / n

    return asyncio.run(run())


def _wsgi_endpoint(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    data = json.loads(environ["wsgi.input"].read())
    body = json.dumps({"id": 1, "item": data["item"], "quantity": data["quantity"]}).encode()
    start_response(
        "201 Created",
        [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
    )
    return [body]


def _wsgi_cpu_us(app: Any, keys: Callable[[int], bytes | None], n: int) -> float:
    def environ(key: bytes | None) -> dict[str, Any]:
        env = {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": "/orders",
            "QUERY_STRING": "",
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(BODY)),
            "HTTP_HOST": "bench",
            "wsgi.input": io.BytesIO(BODY),
        }
        if key is not None:
            env["HTTP_IDEMPOTENCY_KEY"] = key.decode()
        return env

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        return None

    for _ in app(environ(keys(-1)), start_response):
        pass
    environs = [environ(keys(i)) for i in range(n)]
    start = time.process_time()
    for env in environs:
        result = app(env, start_response)
        for _ in result:
            pass
        close = getattr(result, "close", None)
        if close is not None:
            close()
    return (time.process_time() - start) * 1e6 / n


def measure(requests: int, repeat: int, only: list[str] | None = None) -> dict[str, float]:
    """Return the median CPU microseconds per request of each case (or of those in ``only``)."""
    from retrysafe.asgi import IdempotencyMiddleware as ASGIMiddleware

    try:
        from retrysafe.wsgi import IdempotencyMiddleware as WSGIMiddleware
    except ImportError:  # an older retrysafe, measured for comparison
        WSGIMiddleware = None

    def new_key(i: int) -> bytes:
        return f'"k-{time.monotonic_ns()}-{i}"'.encode()

    def same_key(_: int) -> bytes:
        return b'"same"'

    def no_key(_: int) -> None:
        return None

    bare = build_app("bare")
    cases: dict[str, Callable[[], float]] = {
        "asgi bare endpoint": lambda: _asgi_cpu_us(bare, no_key, requests),
        "asgi memory, new key": lambda: _asgi_cpu_us(
            ASGIMiddleware(bare, store=AsyncMemoryStore(), detach_handler="never"),
            new_key,
            requests,
        ),
        "asgi memory, replay": lambda: _asgi_cpu_us(
            ASGIMiddleware(bare, store=AsyncMemoryStore(), detach_handler="never"),
            same_key,
            requests,
        ),
        "asgi memory, no key": lambda: _asgi_cpu_us(
            ASGIMiddleware(bare, store=AsyncMemoryStore(), detach_handler="never"), no_key, requests
        ),
        "asgi do-nothing store, new key": lambda: _asgi_cpu_us(
            ASGIMiddleware(bare, store=NullStore(), detach_handler="never"), new_key, requests
        ),
        "asgi lean prototype, new key": lambda: _asgi_cpu_us(
            LeanASGI(bare, "memory://"), new_key, requests
        ),
        "asgi lean prototype, replay": lambda: _asgi_cpu_us(
            LeanASGI(bare, "memory://"), same_key, requests
        ),
        "wsgi bare endpoint": lambda: _wsgi_cpu_us(_wsgi_endpoint, no_key, requests),
        "wsgi memory, new key": lambda: _wsgi_cpu_us(
            WSGIMiddleware(_wsgi_endpoint, store=MemoryStore()), new_key, requests
        ),
        "wsgi memory, replay": lambda: _wsgi_cpu_us(
            WSGIMiddleware(_wsgi_endpoint, store=MemoryStore()), same_key, requests
        ),
        "wsgi memory, no key": lambda: _wsgi_cpu_us(
            WSGIMiddleware(_wsgi_endpoint, store=MemoryStore()), no_key, requests
        ),
        "wsgi do-nothing store, new key": lambda: _wsgi_cpu_us(
            WSGIMiddleware(_wsgi_endpoint, store=NullStore()), new_key, requests
        ),
        "wsgi lean prototype, new key": lambda: _wsgi_cpu_us(
            LeanWSGI(_wsgi_endpoint), new_key, requests
        ),
        "wsgi lean prototype, replay": lambda: _wsgi_cpu_us(
            LeanWSGI(_wsgi_endpoint), same_key, requests
        ),
    }
    if WSGIMiddleware is None:
        cases = {name: case for name, case in cases.items() if not name.startswith("wsgi")}
    if only:
        unknown = set(only) - set(cases)
        if unknown:
            raise SystemExit(f"unknown case(s): {', '.join(sorted(unknown))}")
        cases = {name: cases[name] for name in only}
    results: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeat):  # interleaved, so a noisy moment hits every case alike
        for name, case in cases.items():
            results[name].append(case())
    figures = {name: statistics.median(values) for name, values in results.items()}
    # What the targets are stated in: the middleware's own cost over the bare endpoint.
    for shell in ("asgi", "wsgi"):
        bare_us = figures.get(f"{shell} bare endpoint")
        for case in ("memory, new key", "memory, no key", "lean prototype, new key"):
            if bare_us is not None and f"{shell} {case}" in figures:
                figures[f"{shell} {case}: over bare"] = figures[f"{shell} {case}"] - bare_us
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--only", action="append", help="run only this case (repeatable)")
    args = parser.parse_args(argv)
    figures = measure(args.requests, args.repeat, args.only)
    width = max(map(len, figures))
    for name, value in figures.items():
        print(f"{name:<{width}}  {value:7.1f} us/request")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
