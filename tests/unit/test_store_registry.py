"""Stores chosen by URL: known schemes build stores, unknown ones are a ConfigurationError; one
URL parser for every backend; backends from outside the package, by a call or an entry point."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from retrysafe import ConfigurationError, async_store_from_url, store_from_url
from retrysafe.stores import (
    AsyncMemoryStore,
    AsyncSQLiteStore,
    AsyncStore,
    Backend,
    MemoryStore,
    SQLiteStore,
    Store,
    register_backend,
    resolve_async_store,
    resolve_store,
)
from retrysafe.stores._registry import schemes

ROOT = Path(__file__).resolve().parents[2]


def test_memory_url_builds_memory_stores() -> None:
    assert isinstance(store_from_url("memory://"), MemoryStore)
    assert isinstance(async_store_from_url("memory://"), AsyncMemoryStore)


async def test_sqlite_url_builds_a_working_store_at_that_path(tmp_path: object) -> None:
    path = f"{tmp_path}/s.db"
    store = async_store_from_url(f"sqlite:///{path}?busy_timeout=2")
    assert isinstance(store, AsyncSQLiteStore)
    assert store.sync.path == path
    reservation = await store.reserve("rid", "fp", lease=5, ttl=60)
    assert reservation.acquired
    sync = store_from_url(f"sqlite:///{path}")
    assert isinstance(sync, SQLiteStore)
    record = sync.get("rid")
    assert record is not None and record.state == "in_progress"
    sync.close()
    await store.aclose()


@pytest.mark.parametrize(
    "url", ["mongodb://localhost", "memcached://x", "nothing", "", "sqlite:/x"]
)
def test_unknown_scheme_names_the_known_schemes(url: str) -> None:
    for build in (store_from_url, async_store_from_url):
        with pytest.raises(ConfigurationError) as info:
            build(url)
        message = str(info.value)
        for scheme in ("memory://", "sqlite://", "postgresql://", "redis://"):
            assert scheme in message


def test_scheme_is_case_insensitive() -> None:
    assert isinstance(store_from_url("MEMORY://"), MemoryStore)


def test_sqlite_url_without_path_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        store_from_url("sqlite:///")


def test_resolve_accepts_urls_instances_and_local_sync_stores() -> None:
    memory = MemoryStore()
    assert isinstance(resolve_async_store("memory://"), AsyncStore)
    wrapped = resolve_async_store(memory)
    assert isinstance(wrapped, AsyncStore)
    assert getattr(wrapped, "sync", None) is memory
    async_store = AsyncMemoryStore()
    assert resolve_async_store(async_store) is async_store
    assert resolve_store(memory) is memory
    assert isinstance(resolve_store("memory://"), Store)


@pytest.mark.parametrize("thing", [42, object(), None])
def test_resolving_a_non_store_is_a_configuration_error(thing: object) -> None:
    with pytest.raises(ConfigurationError):
        resolve_async_store(thing)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        resolve_store(thing)  # type: ignore[arg-type]


def test_async_store_is_not_accepted_where_a_sync_store_is_needed() -> None:
    with pytest.raises(ConfigurationError):
        resolve_store(AsyncMemoryStore())  # type: ignore[arg-type]


# -- one URL parser: options become constructor options, anything else is named -----------------


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("sqlite:///x.db?busy_timout=1", "'busy_timout' in the sqlite:// store URL (did you mean"),
        ("postgresql://h/db?tabel=t", "'tabel' in the postgresql:// store URL (did you mean"),
        ("redis://h/0?prefx=a:", "'prefx' in the redis:// store URL (did you mean 'prefix'?"),
        ("redis+cluster://h:1?socket_timeout=1", "'socket_timeout' in the redis+cluster://"),
        ("memory://?size=1", "'size' in the memory:// store URL"),
    ],
)
def test_an_unknown_url_option_is_named(url: str, named: str) -> None:
    for build in (store_from_url, async_store_from_url):
        with pytest.raises(ConfigurationError, match="unknown option") as info:
            build(url)
        assert named in str(info.value)


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("sqlite:///x.db?busy_timeout=soon", "busy_timeout='soon'"),
        ("postgresql://h/db?max_size=-1", "max_size='-1'"),
        ("postgresql://h/db?auto_create=maybe", "auto_create='maybe'"),
        ("redis://h/0?timeout=0", "timeout='0'"),
        ("redis://h/0?heartbeat=0.1", "heartbeat='0.1'"),
    ],
)
def test_a_bad_option_value_is_named(url: str, named: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        store_from_url(url)
    assert named in str(info.value)


def test_options_reach_the_constructor_and_driver_options_stay_in_the_url() -> None:
    from retrysafe.stores.postgres import PostgresStore
    from retrysafe.stores.redis import RedisStore

    pg = store_from_url("postgresql://u:p%40w@h:5/db?table=s.t&max_size=3&sslmode=disable")
    assert isinstance(pg, PostgresStore)
    assert (pg.options.table, pg.options.max_size) == ("s.t", 3)
    assert pg.options.dsn == "postgresql://u:p%40w@h:5/db?sslmode=disable"
    redis = store_from_url("redis://h:1/2?prefix=p:&health_check_interval=5&heartbeat=0")
    assert isinstance(redis, RedisStore) and redis.prefix == "p:"
    redis.close()


def test_the_parser_splits_hosts_credentials_and_paths() -> None:
    from retrysafe.stores._url import split_url

    url = split_url("rediss+cluster://us%3Aer:p%40ss@h1:7000,[::1]:7001,h3/x?b=1&a=2")
    assert (url.scheme, url.username, url.password) == ("rediss+cluster", "us:er", "p@ss")
    assert url.hosts == (("h1", 7000), ("::1", 7001), ("h3", None))
    assert (url.path, url.passed) == ("x", (("b", "1"), ("a", "2")))
    assert split_url("sqlite:////abs/file.db").path == "/abs/file.db"
    assert split_url("sqlite:///rel.db").path == "rel.db"
    bare = split_url("django")
    assert (bare.scheme, bare.location, bare.path) == ("django", "", "")
    with pytest.raises(ConfigurationError, match="bad port"):
        split_url("redis://h:port")


def test_a_sqlite_url_with_a_host_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"sqlite:///file\.db"):
        store_from_url("sqlite://relative.db")


# -- the registry knows no backend by name --------------------------------------------------------


def test_every_store_says_its_kind() -> None:
    from retrysafe.contrib._instrument import instrument, store_kind
    from retrysafe.stores.postgres import AsyncPostgresStore, PostgresStore
    from retrysafe.stores.redis import AsyncRedisStore, RedisStore
    from retrysafe.stores.redis_cluster import AsyncRedisClusterStore, RedisClusterStore

    assert store_kind(AsyncMemoryStore()) == store_kind(MemoryStore()) == "memory"
    assert store_kind(instrument(MemoryStore(), lambda _: contextlib.nullcontext())) == "memory"
    assert store_kind(AsyncSQLiteStore(":memory:")) == SQLiteStore.kind == "sqlite"
    assert AsyncPostgresStore.kind == PostgresStore.kind == "postgres"
    assert AsyncRedisStore.kind == RedisStore.kind == "redis"
    assert AsyncRedisClusterStore.kind == RedisClusterStore.kind == "redis"


def test_a_scheme_is_served_by_one_backend_unless_replaced(registry: None) -> None:
    taken = Backend(name="other", schemes=("memory",), store=SQLiteStore)
    with pytest.raises(ConfigurationError, match="taken by the memory backend"):
        register_backend(taken)
    assert isinstance(store_from_url("memory://"), MemoryStore)
    register_backend(taken, replace=True)
    with pytest.raises(ConfigurationError, match="not a sqlite:/// URL"):
        store_from_url("memory://")  # now the other backend's, which refuses it


def test_importing_the_stores_imports_no_driver() -> None:
    code = (
        "import sys, retrysafe.stores, retrysafe\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'asyncpg', 'psycopg', 'psycopg_pool', 'redis', 'hiredis', 'django'})\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# What a machine without the drivers sees: their imports fail.
_WITHOUT_DRIVERS = """
import sys
from importlib.abc import MetaPathFinder

class Missing(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"asyncpg", "psycopg", "psycopg_pool", "redis", "hiredis"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Missing())
from retrysafe import ConfigurationError
from retrysafe.stores import async_store_from_url, store_from_url

store_from_url("memory://").close()
for url, extra in [
    ("postgresql://h/db", "postgres"),
    ("redis://h", "redis"),
    ("rediss+cluster://h:1", "redis"),
]:
    for build in (store_from_url, async_store_from_url):
        try:
            build(url)
        except ConfigurationError as exc:
            assert f"pip install 'retrysafe[{extra}]'" in str(exc), exc
        else:
            raise AssertionError(f"{url} built without its driver")
print("ok")
"""


def test_a_missing_driver_names_its_extra_only_when_its_scheme_is_used() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_DRIVERS], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# -- third-party backends: by a call, or by an entry point ----------------------------------------


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry as it is now, back after the test (what it registers is forgotten)."""
    from retrysafe.stores import _registry

    monkeypatch.setattr(_registry, "_by_scheme", dict(_registry._by_scheme))


async def test_a_backend_registered_by_a_call_is_built_from_its_url(registry: None) -> None:
    from tests.stores import thirdparty

    thirdparty.register()
    sync = store_from_url("tiny://registry-call?clock_skew=0")
    assert isinstance(sync, thirdparty.TinyStore)
    store = async_store_from_url("tiny://registry-call")  # no async class: run inline
    won = await store.reserve("k", "fp", lease=5, ttl=60)
    assert won.token and not sync.reserve("k", "fp", lease=5, ttl=60).acquired
    with pytest.raises(ConfigurationError, match="'clock_skw'"):
        store_from_url("tiny://x?clock_skw=1")


def _install_entry_points(root: Path, lines: str) -> None:
    """A distribution that declares ``retrysafe.stores`` entry points, as pip would install it."""
    info = root / "tiny_store-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-store\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[retrysafe.stores]\n{lines}\n")


def test_a_backend_installed_with_an_entry_point_is_found_by_its_scheme(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registry: None
) -> None:
    from tests.stores import thirdparty

    _install_entry_points(
        tmp_path,
        "tiny-ep = tests.stores.thirdparty:ENTRY_POINT_BACKEND\n"
        "broken = tests.stores.no_such_module:BACKEND [fast]",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "tiny-ep" in schemes()
    store = store_from_url("tiny-ep://found?clock_skew=0")
    assert isinstance(store, thirdparty.TinyStore)
    assert store.reserve("k", "fp", lease=5, ttl=60).acquired
    with pytest.raises(ConfigurationError, match=r"pip install 'tiny-store\[fast\]'"):
        store_from_url("broken://x")


def test_django_urls_resolve_through_the_registry() -> None:
    code = (
        "import django; django.setup()\n"
        "from retrysafe.stores import async_store_from_url, resolve_async_store, store_from_url\n"
        "from retrysafe.contrib.django.store import AsyncDjangoStore, DjangoStore\n"
        "sync = store_from_url('django://default')\n"
        "assert isinstance(sync, DjangoStore) and sync.alias == 'default'\n"
        "assert store_from_url('django').alias == 'default'\n"
        "assert isinstance(async_store_from_url('django://pg'), AsyncDjangoStore)\n"
        "assert resolve_async_store(sync).sync is sync\n"
        "from retrysafe import ConfigurationError\n"
        "try:\n"
        "    store_from_url('django://nope')\n"
        "except ConfigurationError as exc:\n"
        "    assert 'nope' in str(exc)\n"
        "else:\n"
        "    raise AssertionError('unknown alias accepted')\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.django.settings"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
