"""The Django tests' settings module is set here only, so the rest of the suite never sees a
configured Django."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django.settings")

import django

django.setup()

import asyncio  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import threading  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from django.test import AsyncClient, Client  # noqa: E402

from retrysafe.stores import MemoryStore  # noqa: E402

from ..conftest import RUN_ID  # noqa: E402
from . import views  # noqa: E402

_prefixes = itertools.count(1)

#: Every store the Django middleware runs on; the ORM ones need a real (flushed) database.
STORES = [
    "memory",
    "sqlite",
    "postgres",
    "redis",
    pytest.param("django", marks=pytest.mark.django_db(transaction=True)),
    pytest.param("django-pg", marks=pytest.mark.django_db(transaction=True, databases=["pg"])),
]
CLIENTS = ["django", "django-async"]


_loop: asyncio.AbstractEventLoop | None = None


def event_loop() -> asyncio.AbstractEventLoop:
    """The one event loop every async client runs on (in a thread of its own), as under an
    ASGI server: async stores (asyncpg, redis) bind their connections to the loop of first use."""
    global _loop
    if _loop is None:
        _loop = asyncio.new_event_loop()
        threading.Thread(target=_loop.run_forever, name="django-asgi-loop", daemon=True).start()
    return _loop


class Api:
    """One Django test client (sync ``Client`` or ``AsyncClient``) behind one call shape."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        cls = Client if kind == "django" else AsyncClient
        self.client = cls(raise_request_exception=False)

    def send(
        self,
        method: str,
        path: str,
        body: bytes | str = b"{}",
        *,
        key: str | None = None,
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        """Send one request; returns the response (``.body`` holds its whole body)."""
        sent = dict(headers or {})
        if key is not None:
            sent["Idempotency-Key"] = f'"{key}"'
        call = getattr(self.client, method.lower())
        kwargs: dict[str, Any] = {"headers": sent}
        if method.upper() != "GET":
            kwargs.update(data=body, content_type=content_type)
        if self.kind == "django":
            response = call(path, **kwargs)
        else:
            future = asyncio.run_coroutine_threadsafe(call(path, **kwargs), event_loop())
            response = future.result(timeout=60)
        if response.streaming and response.is_async:

            async def drain() -> bytes:
                return b"".join([chunk async for chunk in response.streaming_content])

            response.body = asyncio.run_coroutine_threadsafe(drain(), event_loop()).result(10)
        elif response.streaming:
            response.body = b"".join(response.streaming_content)
        else:
            response.body = response.content
        return response

    def post(self, path: str, body: bytes | str = b"{}", **kwargs: Any) -> Any:
        return self.send("POST", path, body, **kwargs)


def problem_type(response: Any) -> str:
    """The RFC 9457 type slug of a problem response."""
    assert response["Content-Type"] == "application/problem+json"
    data = json.loads(response.body)
    assert data["status"] == response.status_code
    return str(data["type"]).rsplit(":", 1)[-1]


@pytest.fixture(autouse=True)
def _fresh_views() -> None:
    views.CALLS.clear()
    views.GATES.clear()


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    """``RETRYSAFE["STORE"]`` for each store (a real server for PostgreSQL and Redis)."""
    kind = request.param
    if kind == "memory":
        return MemoryStore()  # one object, so that every client of the test shares it
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    if kind == "postgres":
        from ..stores.backend_postgres import fresh_table_url

        return fresh_table_url(request)
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
        return f"{url}?prefix=rs-django-{RUN_ID}-{next(_prefixes)}:"
    return "django" if kind == "django" else "django://pg"


@pytest.fixture(params=CLIENTS)
def client_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_api(settings: Any, store: Any, client_kind: str) -> Callable[..., Api]:
    """``make_api(**options)``: a client of the test project with ``RETRYSAFE`` = the store and
    ``options`` (upper-case keys)."""

    def make(**options: Any) -> Api:
        settings.RETRYSAFE = {"STORE": store, **options}
        return Api(client_kind)

    return make


@pytest.fixture(autouse=True)
def _close_stores(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Close every store the test's middleware instances opened (Django has no shutdown hook for
    middleware; a server process closes them by exiting)."""
    from retrysafe.contrib.django import middleware

    opened: list[Any] = []

    def track(factory: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def build(spec: Any) -> Any:
            store = factory(spec)
            opened.append(store)
            return store

        return build

    monkeypatch.setattr(middleware, "sync_store", track(middleware.sync_store))
    monkeypatch.setattr(middleware, "async_store", track(middleware.async_store))
    yield
    for store in opened:
        if hasattr(store, "aclose"):
            asyncio.run_coroutine_threadsafe(store.aclose(), event_loop()).result(timeout=10)
        else:
            store.close()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: Any, django_db_blocker: Any) -> Any:
    """pytest-django's test databases; before they are dropped, end the PostgreSQL sessions
    that threads beside the tests (lease renewal, asgiref's executor) still hold on them."""
    yield
    from django.conf import settings

    name = settings.DATABASES["pg"]["NAME"]  # the test database's name while it exists
    if not name.startswith("test_rs_django_"):
        return
    import psycopg

    from ..conftest import POSTGRES_URL

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
