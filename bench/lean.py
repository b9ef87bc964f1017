"""The lean-prototype baseline of `make bench`: what the store and the server allow.

A pure-ASGI middleware (and its WSGI twin for the in-process figures) that reads the key, hashes
the body, does one reserve-or-get round trip, captures the response and completes it: no leases,
fencing, scoping, problem bodies, status policy or failure handling. Nobody should deploy it; it
only shows how close the real middleware is to the floor on each store::

    LeanASGI(app, "redis://127.0.0.1:6379/0?prefix=bench:")   # or memory://, sqlite:///f.db,
                                                               # postgresql://...
"""

from __future__ import annotations

import hashlib
import io
import sqlite3
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

# One reserve-or-get per request: (fingerprint, stored response or None) of an existing key,
# else None (this request reserved it). Then one write of the response.
_PG_TABLE = "lean_keys"


class _Memory:
    def __init__(self) -> None:
        self.data: dict[bytes, list[Any]] = {}

    async def reserve(self, key: bytes, fp: bytes) -> Any:
        return self.reserve_sync(key, fp)

    def reserve_sync(self, key: bytes, fp: bytes) -> Any:
        found = self.data.get(key)
        if found is None:
            self.data[key] = [fp, None]
        return found

    async def complete(self, key: bytes, fp: bytes, data: bytes) -> None:
        self.data[key][1] = data

    def complete_sync(self, key: bytes, data: bytes) -> None:
        self.data[key][1] = data


class _Redis:  # SET NX GET: reservation and read of a taken key in one round trip
    def __init__(self, url: str) -> None:
        # The project's lean hiredis connection (retrysafe's Redis store uses it too): what the
        # store allows, not what redis-py costs (65-130 us of client CPU per command).
        from retrysafe.stores._redis_lean import LeanRedis, pack_command

        parts = urlsplit(url)
        self.prefix = dict(parse_qsl(parts.query)).get("prefix", "lean:").encode()
        self.redis = LeanRedis(parts.hostname or "127.0.0.1", parts.port or 6379)
        self.pack = pack_command

    async def reserve(self, key: bytes, fp: bytes) -> Any:
        old = await self.redis.execute(
            self.pack((b"SET", self.prefix + key, b"P" + fp, b"NX", b"GET", b"EX", b"86400"))
        )
        return None if old is None else [old[1:33], old[33:] or None]

    async def complete(self, key: bytes, fp: bytes, data: bytes) -> None:
        await self.redis.execute(
            self.pack((b"SET", self.prefix + key, b"C" + fp + data, b"EX", b"86400"))
        )


class _SQLite:  # inline on the loop, like retrysafe's SQLite store
    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")  # as retrysafe's SQLite store
        self.db.execute("CREATE TABLE IF NOT EXISTS lean (k BLOB PRIMARY KEY, fp BLOB, r BLOB)")

    async def reserve(self, key: bytes, fp: bytes) -> Any:
        if self.db.execute("INSERT OR IGNORE INTO lean VALUES (?, ?, NULL)", (key, fp)).rowcount:
            return None
        return list(self.db.execute("SELECT fp, r FROM lean WHERE k = ?", (key,)).fetchone())

    async def complete(self, key: bytes, fp: bytes, data: bytes) -> None:
        self.db.execute("UPDATE lean SET r = ? WHERE k = ?", (data, key))


class _Postgres:  # asyncpg, one pooled connection per statement
    def __init__(self, url: str) -> None:
        base, _, query = url.partition("?")
        # The bench finds the store's server processes by application_name.
        self.name = dict(parse_qsl(query)).get("application_name", "lean")
        self.url, self.pool = base, None

    async def _pool(self) -> Any:
        if self.pool is None:
            import asyncpg

            self.pool = await asyncpg.create_pool(
                self.url, min_size=4, max_size=16, server_settings={"application_name": self.name}
            )
            await self.pool.execute(  # a fresh table per server: no key of an earlier run
                f"DROP TABLE IF EXISTS {_PG_TABLE}; "
                f"CREATE TABLE {_PG_TABLE} (k bytea PRIMARY KEY, fp bytea, r bytea)"
            )
        return self.pool

    async def reserve(self, key: bytes, fp: bytes) -> Any:
        pool = await self._pool()
        row = await pool.fetchrow(
            f"WITH ins AS (INSERT INTO {_PG_TABLE} VALUES ($1, $2, NULL) ON CONFLICT DO NOTHING "
            f"RETURNING k) SELECT fp, r FROM {_PG_TABLE} WHERE k = $1 AND NOT EXISTS "
            "(SELECT 1 FROM ins)",
            key,
            fp,
        )
        return None if row is None else [row[0], row[1]]

    async def complete(self, key: bytes, fp: bytes, data: bytes) -> None:
        await self.pool.execute(f"UPDATE {_PG_TABLE} SET r = $2 WHERE k = $1", key, data)


def backend(url: str) -> Any:
    """The lean store for a retrysafe-style store URL."""
    if url.startswith("memory:"):
        return _Memory()
    if url.startswith("redis:"):
        return _Redis(url)
    if url.startswith("sqlite:"):
        return _SQLite(url.removeprefix("sqlite:///"))
    if url.startswith(("postgres:", "postgresql:")):
        return _Postgres(url)
    raise SystemExit(f"lean prototype: no backend for {url!r}")


def _encode(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bytes:
    head = b"\n".join(b"%s:%s" % pair for pair in headers)
    return b"%d\n%d\n%s%s" % (status, len(head), head, body)


def _decode(data: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    status, size, rest = data.split(b"\n", 2)
    head, body = rest[: int(size)], rest[int(size) :]
    pairs = [line.split(b":", 1) for line in head.split(b"\n")] if head else []
    return int(status), [(n, v) for n, v in pairs], body


class LeanASGI:
    """The ASGI prototype (see the module docstring)."""

    def __init__(self, app: Any, store: str) -> None:
        self.app, self.store = app, backend(store)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        key = None
        if scope["type"] == "http" and scope["method"] == "POST":
            for name, value in scope["headers"]:
                if name == b"idempotency-key":
                    key = value
        if key is None:
            return await self.app(scope, receive, send)
        message = await receive()
        body = message.get("body", b"")
        while message.get("more_body"):
            message = await receive()
            body += message.get("body", b"")
        fp = hashlib.sha256(body).hexdigest().encode()[:32]
        found = await self.store.reserve(key, fp)
        if found is not None:
            if found[0] != fp or found[1] is None:
                status, headers, out = (422 if found[0] != fp else 409), [], b""
            else:
                status, headers, out = _decode(found[1])
                headers.append((b"idempotency-replayed", b"true"))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": out})
            return
        sent: list[bool] = []
        chunks: list[bytes] = []
        start: dict[str, Any] = {}

        async def app_receive() -> Any:
            if not sent:
                sent.append(True)
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        async def app_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            else:
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    data = _encode(start["status"], start.get("headers", []), b"".join(chunks))
                    await self.store.complete(key, fp, data)
            await send(message)

        await self.app(scope, app_receive, app_send)


class LeanWSGI:
    """The WSGI twin (memory only)."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app, self.store = app, _Memory()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        key = environ.get("HTTP_IDEMPOTENCY_KEY")
        if key is None or environ["REQUEST_METHOD"] != "POST":
            return self.app(environ, start_response)
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        environ["wsgi.input"] = io.BytesIO(body)
        fp = hashlib.sha256(body).hexdigest().encode()[:32]
        found = self.store.reserve_sync(key.encode(), fp)
        if found is not None:
            if found[0] != fp or found[1] is None:
                start_response("422 Unprocessable" if found[0] != fp else "409 Conflict", [])
                return [b""]
            status, headers, out = _decode(found[1])
            native = [(n.decode(), v.decode()) for n, v in headers]
            start_response(f"{status} OK", [*native, ("Idempotency-Replayed", "true")])
            return [out]
        seen: list[Any] = []

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            seen[:] = [status, headers]
            return start_response(status, headers, exc_info)

        result = self.app(environ, capture)
        out = b"".join(result)
        raw = [(n.lower().encode(), v.encode()) for n, v in seen[1]]
        self.store.complete_sync(key.encode(), _encode(int(seen[0][:3]), raw, out))
        return [out]
