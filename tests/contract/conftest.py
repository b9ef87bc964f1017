"""Fixtures of the wire-contract suite: every shell (ids ``asgi``, ``wsgi``, ``flask``,
``django``, ``django-async``) over every store (ids ``memory``, ``sqlite``, ``postgres``,
``mysql``, ``redis``; async stores behind ASGI and Django's ASGI path, sync ones behind WSGI,
Flask and Django's WSGI path), each store isolated per test (a fresh file, table or key prefix,
as tests/stores does). Shell ``aiohttp`` (aiohttp's test server, ``aiohttp_front.py``) takes
async stores."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

from retrysafe.stores import AsyncMemoryStore, AsyncSQLiteStore, MemoryStore, SQLiteStore, Store

from ..conftest import service_missing
from ..stores import backend_mysql
from ..stores.backend_postgres import admin_connect, fresh_table_url
from ..stores.backend_redis import delete_prefixed, unique_prefix, with_prefix
from .harness import ASYNC_SHELLS, Service, World

SHELLS = [
    pytest.param("asgi", id="asgi"),
    pytest.param("wsgi", id="wsgi"),
    pytest.param("flask", id="flask"),  # Flask's test client, retrysafe.contrib.flask
    # Django's test clients, retrysafe.contrib.django: django.test.Client over sync views (the
    # middleware's WSGI path), django.test.AsyncClient over async views (its ASGI path).
    pytest.param("django", id="django"),
    pytest.param("django-async", id="django-async"),
    # aiohttp's own test server on loopback, retrysafe.contrib.aiohttp.
    pytest.param("aiohttp", id="aiohttp"),
]
#: The framework each test-client shell needs (skipped where it is not installed, failed in CI).
FRAMEWORKS = {"flask": "flask", "django": "django", "django-async": "django", "aiohttp": "aiohttp"}

_ONE_VALUE_PER_NAME = (
    "Django's HttpResponse holds one value per header name: a view cannot send a field twice "
    "(Django joins them with ', ', and so does the middleware's replay), so repeated fields "
    "cannot be told apart from one field on this shell"
)
_ONE_PATH_NOT_UTF8 = (
    "the app receives one path for both: {}, decoded as UTF-8 with U+FFFD for each invalid byte"
)
_ONE_PATH_SLASH = (
    "the app receives one path for both: {} decoded %2F into / (only an ASGI app sees raw_path)"
)
#: Contract tests a shell cannot express, with the reason: (shell, test name) -> reason.
CANNOT_EXPRESS = {
    ("django", "test_repeated_header_fields_are_all_replayed_in_order"): _ONE_VALUE_PER_NAME,
    ("django-async", "test_repeated_header_fields_are_all_replayed_in_order"): _ONE_VALUE_PER_NAME,
    ("flask", "test_paths_that_differ_in_bytes_that_are_not_utf8_are_two_records"): (
        _ONE_PATH_NOT_UTF8.format("Werkzeug's test client builds PATH_INFO")
    ),
    ("django-async", "test_paths_that_differ_in_bytes_that_are_not_utf8_are_two_records"): (
        _ONE_PATH_NOT_UTF8.format("Django's ASGI request reads scope['path']")
    ),
    **{
        (shell, "test_an_encoded_slash_is_another_path_than_a_slash"): _ONE_PATH_SLASH.format(
            "PATH_INFO, where the WSGI server"
            if shell != "django-async"
            else "Django's ASGI request reads scope['path'], where the server"
        )
        for shell in ("wsgi", "flask", "django", "django-async")
    },
}
#: Cases of a parametrized contract test a shell cannot express: (shell, test name, case id).
CANNOT_EXPRESS_CASES = {
    ("aiohttp", "test_malformed_key_is_400_and_nothing_runs", "control"): (
        "aiohttp's HTTP parser refuses a control character in a header value with its own 400 "
        "before any middleware runs (nothing runs either way)"
    ),
}
STORES = [
    pytest.param("memory", id="memory"),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres"),
    pytest.param("mysql", id="mysql"),
    pytest.param("redis", id="redis"),
]


class ShiftClock:
    """Wall-clock time plus a shift the test moves (for the stores that take ``clock=``)."""

    def __init__(self) -> None:
        self.shift = 0.0

    def __call__(self) -> float:
        return time.time() + self.shift


class Backend:
    """One isolated store of one kind, for one shell.

    Attributes:
        kind: ``memory``, ``sqlite``, ``postgres``, ``mysql`` or ``redis``.
        shell: the shell it serves: async stores for ``ASYNC_SHELLS``, sync ones otherwise.
    """

    def __init__(self, kind: str, shell: str, request: pytest.FixtureRequest, tmp: Path) -> None:
        self.kind = kind
        self.shell = shell
        self.is_async = shell in ASYNC_SHELLS
        self.clock = ShiftClock()
        self._cleanups: list[Callable[[], None]] = []
        self._shared: Any = None
        if kind == "memory":
            if self.is_async:
                self._shared = AsyncMemoryStore(clock=self.clock)
            else:
                self._shared = MemoryStore(clock=self.clock)
        elif kind == "sqlite":
            self.path = tmp / "contract.db"
        elif kind == "postgres":
            self.url = fresh_table_url(request, max_size="4")
            self.table = dict(parse_qsl(urlsplit(self.url).query))["table"]
        elif kind == "mysql":
            self.url = backend_mysql.fresh_table_url(request, max_size="4")
            self.table = dict(parse_qsl(urlsplit(self.url).query))["table"]
        else:
            base: str = request.getfixturevalue("redis_url")
            prefix = unique_prefix("contract")
            self.url = with_prefix(base, prefix)
            self.prefix = prefix
            self.base_url = base

            def drop() -> None:
                delete_prefixed(base, prefix)  # this test's keys only, never FLUSHDB

            self._cleanups.append(drop)

    def store(self) -> Any:
        """A store over this backend's data, for the backend's shell (a new one per call, except
        memory, whose data lives in the one instance)."""
        if self._shared is not None:
            return self._shared
        if self.kind == "sqlite":
            if self.is_async:
                return AsyncSQLiteStore(self.path, clock=self.clock)
            return SQLiteStore(self.path, clock=self.clock)
        if self.kind == "postgres":
            from retrysafe.stores.postgres import AsyncPostgresStore, PostgresStore

            return AsyncPostgresStore(self.url) if self.is_async else PostgresStore(self.url)
        if self.kind == "mysql":
            from retrysafe.stores.mysql import AsyncMySQLStore, MySQLStore

            return AsyncMySQLStore(self.url) if self.is_async else MySQLStore(self.url)
        from retrysafe.stores.redis import AsyncRedisStore, RedisStore

        return AsyncRedisStore(self.url) if self.is_async else RedisStore(self.url)

    def wsgi_store(self) -> Any:
        """A sync store over the same data as an ``asgi`` backend (for an app served by both
        fronts at once); the caller closes it."""
        if self.kind == "memory":
            return self._shared.sync
        if self.kind == "sqlite":
            return SQLiteStore(self.path, clock=self.clock)
        if self.kind == "postgres":
            from retrysafe.stores.postgres import PostgresStore

            return PostgresStore(self.url)
        if self.kind == "mysql":
            from retrysafe.stores.mysql import MySQLStore

            return MySQLStore(self.url)
        from retrysafe.stores.redis import RedisStore

        return RedisStore(self.url)

    def sync_store(self) -> Store:
        """A synchronous store over the same data (for a reservation made "by another
        process"); closed with the backend."""
        store: Store
        if self.kind == "memory":
            shared = self._shared
            store = shared.sync if isinstance(shared, AsyncMemoryStore) else shared
            return store
        if self.kind == "sqlite":
            store = SQLiteStore(self.path, clock=self.clock)
        elif self.kind == "postgres":
            from retrysafe.stores.postgres import PostgresStore

            store = PostgresStore(self.url)
        elif self.kind == "mysql":
            from retrysafe.stores.mysql import MySQLStore

            store = MySQLStore(self.url)
        else:
            from retrysafe.stores.redis import RedisStore

            store = RedisStore(self.url)
        self._cleanups.append(store.close)
        return store

    def lapse_leases(self) -> None:
        """Make every in-progress lease of this backend end now, as if its owner had stopped
        renewing for longer than the lease (memory, SQLite: their clock moves an hour on;
        PostgreSQL, MySQL: the lease ends on the server's clock; Redis: the record's lease TTL runs
        out)."""
        if self.kind in ("memory", "sqlite"):
            self.clock.shift += 3600.0
        elif self.kind == "postgres":
            with admin_connect(self.url) as conn:
                conn.execute(
                    f"UPDATE {self.table} SET lease_expires_at = clock_timestamp() "
                    "- interval '1 second' WHERE state = 0"
                )
        elif self.kind == "mysql":
            with backend_mysql.admin_connect(self.url) as conn, conn.cursor() as cur:
                cur.execute(f"UPDATE `{self.table}` SET lease_expires_at = 0 WHERE state = 0")
        else:
            import redis

            client = redis.Redis.from_url(self.base_url)
            try:
                for name in client.scan_iter(match=f"{self.prefix}*"):
                    if client.hget(name, "s") == b"0":
                        client.pexpire(name, 1)
            finally:
                client.close()
            time.sleep(0.01)

    def close(self) -> None:
        for cleanup in reversed(self._cleanups):
            cleanup()


@pytest.fixture(params=SHELLS)
def shell(request: pytest.FixtureRequest) -> str:
    """Every shell in turn."""
    value: str = request.param
    reason = CANNOT_EXPRESS.get((value, request.node.originalname))
    for (front, name, case), why in CANNOT_EXPRESS_CASES.items():
        if (front, name) == (value, request.node.originalname) and f"-{case}]" in request.node.name:
            reason = why
    if reason is not None:
        pytest.skip(f"{value}: {reason}")
    if value in FRAMEWORKS and importlib.util.find_spec(FRAMEWORKS[value]) is None:
        service_missing(FRAMEWORKS[value], "the package is not installed")  # fails under CI
    return value


@pytest.fixture(params=STORES)
def backend(shell: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Every store kind in turn, isolated to this test."""
    made = Backend(request.param, shell, request, tmp_path)
    yield made
    made.close()


@pytest.fixture
def world() -> World:
    """The effects of this test's app instances."""
    return World()


ServiceFactory = Callable[..., Service]


@pytest.fixture
def make_service(backend: Backend, world: World) -> Iterator[ServiceFactory]:
    """Build app instances over the backend's store (``**options``: IdempotencyConfig)."""
    made: list[Service] = []

    def make(**options: Any) -> Service:
        service = Service(backend.shell, backend.store(), world, **options)
        made.append(service)
        return service

    yield make
    for service in reversed(made):
        service.close()


@pytest.fixture
def svc(make_service: ServiceFactory) -> Service:
    """One app instance with the default settings."""
    return make_service()
