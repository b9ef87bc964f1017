"""Micro-benchmarks of retrysafe's hot path (pytest-benchmark); `make bench` runs them.

    .venv/bin/pytest bench/test_micro.py --benchmark-only

Not collected by `make test` (its testpaths is tests/). Stores come from ``BENCH_STORES``
(default: every store whose module is there); Redis and PostgreSQL use ``BENCH_REDIS_URL`` /
``BENCH_POSTGRES_URL`` under a unique prefix / scratch schema that is removed afterwards.
Async store operations are timed through ``loop.run_until_complete`` on uvloop; subtract
``test_loop_overhead`` (the same call around an empty coroutine) for the store's own cost.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import os
import uuid
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

from retrysafe._core.codec import StoredResponse, decode_response, encode_response
from retrysafe._core.fingerprint import fingerprint
from retrysafe._core.keys import parse_key, record_id
from retrysafe._core.operation import decide
from retrysafe._core.records import Record, Reservation

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
STORES = [
    s
    for s in os.environ.get("BENCH_STORES", "memory,sqlite,redis,postgres").split(",")
    if s and (s in ("memory", "sqlite") or importlib.util.find_spec(f"retrysafe.stores.{s}"))
]


def _json_body(size: int) -> bytes:
    items = []
    body = b""
    for i in itertools.count():
        items.append({"sku": f"SKU-{i:06d}", "quantity": i % 7 + 1, "note": "gift wrap"})
        body = json.dumps({"customer": "c-42", "currency": "EUR", "items": items}).encode()
        if len(body) >= size:
            return body
    raise AssertionError("unreachable")


BODIES = {"1KiB": _json_body(1024), "100KiB": _json_body(100 * 1024)}
FP = fingerprint("POST", "/orders", b"", b'{"item":"book","quantity":2}')
RESPONSE = StoredResponse(
    201,
    ((b"content-type", b"application/json"), (b"location", b"/orders/1")),
    b'{"id":1,"item":"book","quantity":2}',
)
ENCODED = encode_response(RESPONSE)


@pytest.mark.parametrize("size", list(BODIES))
@pytest.mark.parametrize("mode", ["raw", "canonical"])
def test_fingerprint(benchmark: Any, size: str, mode: str) -> None:
    body = BODIES[size]
    canonical = mode == "canonical"
    benchmark(
        fingerprint,
        "POST",
        "/orders",
        b"",
        body,
        canonical_json=canonical,
        content_type=b"application/json",
    )


@pytest.mark.parametrize(
    "case",
    [
        ("execute", Reservation(token="t")),
        ("replay", Reservation(record=Record(FP, "completed", ENCODED))),
        ("mismatch", Reservation(record=Record("other", "completed", ENCODED))),
    ],
    ids=lambda c: c[0],
)
def test_decide(benchmark: Any, case: tuple[str, Reservation]) -> None:
    benchmark(decide, case[1], FP)


@pytest.mark.parametrize(
    "value", [b"7c9e6679-7425-40de-944b-e07fc1f90ae7", b'"7c9e6679-7425-40de-944b-e07fc1f90ae7"']
)
def test_parse_key(benchmark: Any, value: bytes) -> None:
    benchmark(parse_key, [value])


def test_record_id(benchmark: Any) -> None:
    benchmark(record_id, "", "POST", "/orders", "7c9e6679-7425-40de-944b-e07fc1f90ae7")


def test_codec_encode(benchmark: Any) -> None:
    benchmark(encode_response, RESPONSE)


def test_codec_decode(benchmark: Any) -> None:
    benchmark(decode_response, ENCODED)


# -- stores --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    try:
        import uvloop

        event_loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:
        event_loop = asyncio.new_event_loop()
    yield event_loop
    event_loop.close()


def _make_store(kind: str, tmp_dir: str, loop: asyncio.AbstractEventLoop) -> tuple[Any, Any]:
    """Return (async store, cleanup callable)."""
    nonce = uuid.uuid4().hex[:10]
    if kind == "memory":
        from retrysafe.stores import AsyncMemoryStore

        return AsyncMemoryStore(), None
    if kind == "sqlite":
        from retrysafe.stores import AsyncSQLiteStore

        return AsyncSQLiteStore(os.path.join(tmp_dir, "micro.db")), None
    if kind == "redis":
        import redis

        try:
            redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
        except redis.RedisError as exc:
            pytest.skip(f"Redis unreachable: {exc}")
        from retrysafe.stores import async_store_from_url

        prefix = f"benchmicro{nonce}:"
        sep = "&" if "?" in REDIS_URL else "?"
        store = async_store_from_url(f"{REDIS_URL}{sep}prefix={prefix}")

        def cleanup_redis() -> None:
            client = redis.Redis.from_url(REDIS_URL)
            keys = list(client.scan_iter(match=prefix + "*", count=1000))
            for i in range(0, len(keys), 1000):
                client.delete(*keys[i : i + 1000])

        return store, cleanup_redis
    if kind == "postgres":
        import psycopg

        schema = f"benchmicro_{nonce}"
        try:
            with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=3) as conn:
                conn.execute(f'CREATE SCHEMA "{schema}"')
        except psycopg.Error as exc:
            pytest.skip(f"PostgreSQL unreachable: {exc}")
        from retrysafe.stores import async_store_from_url

        sep = "&" if "?" in POSTGRES_URL else "?"
        store = async_store_from_url(f"{POSTGRES_URL}{sep}table={schema}.records")

        def cleanup_postgres() -> None:
            with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')

        return store, cleanup_postgres
    raise AssertionError(kind)


@pytest.fixture(scope="module", params=STORES)
def store(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    loop: asyncio.AbstractEventLoop,
) -> Iterator[Any]:
    async_store, cleanup = _make_store(request.param, str(tmp_path_factory.mktemp("store")), loop)
    loop.run_until_complete(async_store.get("warm-up"))  # connect, create schema
    yield async_store
    loop.run_until_complete(async_store.aclose())
    if cleanup is not None:
        cleanup()


def _runner(
    loop: asyncio.AbstractEventLoop, make: Callable[..., Coroutine[Any, Any, Any]]
) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        return loop.run_until_complete(make(*args))

    return run


def test_loop_overhead(benchmark: Any, loop: asyncio.AbstractEventLoop) -> None:
    async def nothing() -> None:
        return None

    benchmark(_runner(loop, nothing))


def test_store_reserve(benchmark: Any, store: Any, loop: asyncio.AbstractEventLoop) -> None:
    ids = (f"micro-reserve-{uuid.uuid4().hex}-{i}" for i in itertools.count())

    async def reserve() -> Reservation:
        result: Reservation = await store.reserve(next(ids), FP, lease=30.0, ttl=3600.0)
        return result

    assert benchmark(_runner(loop, reserve)).acquired


def test_store_complete(benchmark: Any, store: Any, loop: asyncio.AbstractEventLoop) -> None:
    prefix = f"micro-complete-{uuid.uuid4().hex}-"
    counter = itertools.count()

    def setup() -> tuple[tuple[str, str], dict[str, Any]]:
        rid = f"{prefix}{next(counter)}"
        reservation = loop.run_until_complete(store.reserve(rid, FP, lease=30.0, ttl=3600.0))
        return (rid, reservation.token), {}

    async def complete(rid: str, token: str) -> bool:
        done: bool = await store.complete(rid, token, ENCODED, ttl=3600.0)
        return done

    benchmark.pedantic(_runner(loop, complete), setup=setup, rounds=500, warmup_rounds=20)


def test_store_get(benchmark: Any, store: Any, loop: asyncio.AbstractEventLoop) -> None:
    rid = f"micro-get-{uuid.uuid4().hex}"
    reservation = loop.run_until_complete(store.reserve(rid, FP, lease=30.0, ttl=3600.0))
    assert reservation.token is not None
    assert loop.run_until_complete(store.complete(rid, reservation.token, ENCODED, ttl=3600.0))

    async def get() -> Record | None:
        record: Record | None = await store.get(rid)
        return record

    record = benchmark(_runner(loop, get))
    assert record is not None and record.state == "completed"


def test_store_reserve_replay(benchmark: Any, store: Any, loop: asyncio.AbstractEventLoop) -> None:
    """reserve on a completed key: what a replay costs the store."""
    rid = f"micro-replay-{uuid.uuid4().hex}"
    reservation = loop.run_until_complete(store.reserve(rid, FP, lease=30.0, ttl=3600.0))
    assert reservation.token is not None
    assert loop.run_until_complete(store.complete(rid, reservation.token, ENCODED, ttl=3600.0))

    async def reserve() -> Reservation:
        result: Reservation = await store.reserve(rid, FP, lease=30.0, ttl=3600.0)
        return result

    assert not benchmark(_runner(loop, reserve)).acquired
