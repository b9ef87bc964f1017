"""Shared test fixtures: real services (PostgreSQL, Redis), skipped on a laptop without them and
failing under CI=true, where a missing service is a broken build, not a reason to skip."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

if TYPE_CHECKING:
    from .stores.cluster import RedisClusterProcs

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
REDIS_URL = os.environ.get("RETRYSAFE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get(
    "RETRYSAFE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
MYSQL_URL = os.environ.get("RETRYSAFE_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
AMQP_URL = os.environ.get("RETRYSAFE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
NATS_URL = os.environ.get("RETRYSAFE_TEST_NATS_URL", "nats://127.0.0.1:4222")
#: Unique per test run: every key, prefix and schema a run creates carries it, so a run never
#: touches data it did not create (RETRYSAFE_TEST_RUN_ID sets it, for a test of the cleanup).
RUN_ID = os.environ.get("RETRYSAFE_TEST_RUN_ID") or uuid.uuid4().hex[:10]


def service_missing(name: str, reason: str) -> None:
    """Skip (developer laptop) or fail (CI) a test whose service is not there."""
    message = f"{name} not available: {reason}"
    if IN_CI:
        pytest.fail(f"{message} (CI=true: services must be up)", pytrace=False)
    pytest.skip(message)


#: Suites whose tests share no module- or session-wide fixture (each test makes its own store,
#: app and names): their tests are spread one by one over the workers.
SPREAD_SUITES = ("tests/unit/", "tests/contract/", "tests/calls/")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` (``make test``) keeps each test file on one worker (its module
    fixtures start servers, workers, brokers), except the tests of :data:`SPREAD_SUITES`, each a
    unit of its own: test_wire.py alone holds over a thousand of them. Largest files first, the
    single tests last, to even out the end of the run."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FilesAndSpreadSuites(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return nodeid if path.startswith(SPREAD_SUITES) else path

    return FilesAndSpreadSuites(config, log)


def pytest_report_header() -> str:
    return f"retrysafe test run: {RUN_ID} (every key, prefix and schema it makes carries it)"


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Delete the Redis keys this run wrote (each carries RUN_ID): records, metrics, queues."""
    if _reachable(REDIS_URL, 6379) is not None:
        return
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        for key in client.scan_iter(match=f"*{RUN_ID}*", count=1000):
            client.unlink(key)
    except redis.RedisError:
        pass  # a run without Redis access leaves nothing to clean
    finally:
        client.close()


def _reachable(url: str, default_port: int) -> str | None:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or default_port
    try:
        with socket.create_connection((host, port), timeout=2):
            return None
    except OSError as exc:
        return f"{host}:{port} unreachable ({exc})"


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the real Redis under test (RETRYSAFE_TEST_REDIS_URL)."""
    problem = _reachable(REDIS_URL, 6379)
    if problem:
        service_missing("Redis", problem)
    return REDIS_URL


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """URL of the real PostgreSQL under test (RETRYSAFE_TEST_POSTGRES_URL)."""
    problem = _reachable(POSTGRES_URL, 5432)
    if problem:
        service_missing("PostgreSQL", problem)
    return POSTGRES_URL


@pytest.fixture(scope="session")
def mysql_url() -> str:
    """URL of the real MySQL or MariaDB under test (RETRYSAFE_TEST_MYSQL_URL)."""
    problem = _reachable(MYSQL_URL, 3306)
    if problem:
        service_missing("MySQL/MariaDB", problem)
    return MYSQL_URL


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    """URL of the real RabbitMQ under test (RETRYSAFE_TEST_AMQP_URL)."""
    problem = _reachable(AMQP_URL, 5672)
    if problem:
        service_missing("RabbitMQ", problem)
    return AMQP_URL


@pytest.fixture(scope="session")
def nats_url() -> str:
    """URL of the real NATS server (with JetStream) under test (RETRYSAFE_TEST_NATS_URL)."""
    problem = _reachable(NATS_URL, 4222)
    if problem:
        service_missing("NATS JetStream", problem)
    return NATS_URL


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterProcs]:
    """A real 3-master + 3-replica Redis Cluster on loopback, once per session (the store
    tests and the operator tools' tests share it)."""
    from .stores.cluster import RedisClusterProcs, cluster_binaries

    if cluster_binaries() is None:
        service_missing("redis-server / redis-cli", "not on PATH (Debian: redis-server)")
    procs = RedisClusterProcs(tmp_path_factory.mktemp("redis-cluster"))
    try:
        yield procs.start()
    finally:
        procs.stop()


@pytest.fixture
def tmp_sqlite_url(tmp_path: os.PathLike[str]) -> Iterator[str]:
    """A fresh SQLite store URL in the test's temporary folder."""
    yield f"sqlite:///{os.fspath(tmp_path)}/store.db"
