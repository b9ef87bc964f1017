"""The crash suite (issue 4): SIGKILLed and restarted OrderHub processes, lost responses,
concurrent duplicates, store-side faults. A short run per mode is part of `make test`; `make
chaos` runs the long one (CHAOS_OPS operations, CHAOS_KILLS kills; defaults 2000 and 20)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ..conftest import service_missing
from ..stores import backend_mysql
from ..stores.backend_postgres import admin_connect, run_schema, with_options
from .crash import CrashPlan, CrashReport, run_crash_suite
from .servers import DemoServer, free_port

pytestmark = pytest.mark.e2e

LEASE = 2.0
SHORT = CrashPlan(operations=80, concurrency=10, kills=4, kill_interval=(0.3, 1.0), seed=4)


def _long_plan() -> CrashPlan:
    operations = int(os.environ.get("CHAOS_OPS", "2000"))
    return CrashPlan(
        operations=operations,
        concurrency=16,
        kills=int(os.environ.get("CHAOS_KILLS", "20")),
        kill_interval=(0.5, 1.5),
        delay_after_share=0.25,
        operation_deadline=300.0,
        seed=int(os.environ.get("CHAOS_SEED", "2026")),
        paced=True,  # every kill lands, however soon the store gets through the operations
    )


class DurableRedis:
    """A private redis-server that keeps its data across a SIGKILL (appendfsync always), as a
    Redis used for idempotency must (a restart that loses records loses replays)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0?prefix=crash:"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            service_missing("redis-server binary", "not on PATH")
        assert binary is not None
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                *(binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""),
                *("--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.workdir)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            probe = subprocess.run(
                ["redis-cli", "-p", str(self.port), "ping"], capture_output=True, text=True
            )
            if probe.stdout.strip() == "PONG":
                return
            time.sleep(0.05)
        raise RuntimeError("private redis-server did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def _report(report: CrashReport, mode: str) -> None:
    line = f"[crash:{mode}] {report.summary()}"
    if report.unexpected:
        line += "\n  unexpected: " + " | ".join(report.unexpected[:5])
    print(line)
    with open(Path(os.environ.get("CRASH_REPORT", "test-artifacts/crash-report.txt")), "a") as f:
        f.write(line + "\n")
    assert not report.unexpected, report.unexpected[:5]
    assert report.kills + report.service_faults >= 1


def _assert_exactly_once(report: CrashReport) -> None:
    assert report.unfinished == 0
    assert report.duplicates == 0
    assert report.lost == 0
    assert report.replay_mismatches == 0
    assert report.unknown == 0  # transactional: the effect and its record commit together
    assert report.orders == report.created == report.operations


@pytest.fixture
def artifacts() -> Iterator[None]:
    Path("test-artifacts").mkdir(exist_ok=True)
    yield


def _sqlite_mode(
    demo_servers: Callable[..., DemoServer], tmp_path: Path, plan: CrashPlan
) -> CrashReport:
    store = f"sqlite:///{tmp_path}/shared.db"
    servers = [demo_servers(store, lease=LEASE) for _ in range(2)]
    return asyncio.run(run_crash_suite(servers, plan))


def _postgres_mode(
    demo_servers: Callable[..., DemoServer], request: pytest.FixtureRequest, plan: CrashPlan
) -> CrashReport:
    url, schema = run_schema(request)
    app_name = f"rs-crash-{os.getpid()}-{int(time.time() * 1000) % 10**6}"
    table = f"{schema}.crash_{app_name.rsplit('-', 1)[-1]}"
    store = with_options(url, table=table, application_name=app_name)
    db = with_options(url, schema=schema)
    servers = [demo_servers(store, db=db, lease=LEASE) for _ in range(2)]

    async def terminate_backends(n: int) -> None:
        def run() -> None:
            with admin_connect(url) as conn:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s",
                    (app_name,),
                )

        await asyncio.to_thread(run)

    try:
        return asyncio.run(run_crash_suite(servers, plan, fault=terminate_backends))
    finally:
        for server in servers:
            server.stop()
        with admin_connect(url) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute(f'DROP TABLE IF EXISTS "{schema}".orderhub_orders')
            conn.execute(f'DROP TABLE IF EXISTS "{schema}".orderhub_payments')


def _mysql_mode(
    demo_servers: Callable[..., DemoServer], request: pytest.FixtureRequest, plan: CrashPlan
) -> CrashReport:
    """OrderHub's orders and the store's records in one MySQL database of their own."""
    store = backend_mysql.fresh_database_url(request)
    servers = [demo_servers(store, db=store, lease=LEASE) for _ in range(2)]
    try:
        return asyncio.run(run_crash_suite(servers, plan))
    finally:
        for server in servers:
            server.stop()


def _redis_mode(
    demo_servers: Callable[..., DemoServer], tmp_path: Path, plan: CrashPlan
) -> CrashReport:
    redis = DurableRedis(tmp_path / "redis")
    redis.start()
    db = f"sqlite:///{tmp_path}/orders.db"

    async def restart_redis(n: int) -> None:
        await asyncio.to_thread(redis.kill)
        await asyncio.sleep(0.3)
        await asyncio.to_thread(redis.start)

    try:
        servers = [demo_servers(redis.url, db=db, lease=LEASE) for _ in range(2)]
        return asyncio.run(run_crash_suite(servers, plan, fault=restart_redis))
    finally:
        redis.kill()


def test_crash_sqlite_transactional_is_exactly_once(
    demo_servers: Callable[..., DemoServer], tmp_path: Path, artifacts: None
) -> None:
    report = _sqlite_mode(demo_servers, tmp_path, SHORT)
    _report(report, "sqlite")
    _assert_exactly_once(report)


def test_crash_postgres_transactional_is_exactly_once(
    demo_servers: Callable[..., DemoServer], request: pytest.FixtureRequest, artifacts: None
) -> None:
    report = _postgres_mode(demo_servers, request, SHORT)
    _report(report, "postgres")
    _assert_exactly_once(report)


def test_crash_mysql_transactional_is_exactly_once(
    demo_servers: Callable[..., DemoServer], request: pytest.FixtureRequest, artifacts: None
) -> None:
    report = _mysql_mode(demo_servers, request, SHORT)
    _report(report, "mysql")
    _assert_exactly_once(report)


def test_crash_redis_never_runs_a_committed_operation_twice(
    demo_servers: Callable[..., DemoServer], tmp_path: Path, artifacts: None
) -> None:
    report = _redis_mode(demo_servers, tmp_path, SHORT)
    _report(report, "redis")
    assert report.unfinished == 0
    assert report.lost == 0
    assert report.replay_mismatches == 0
    # mark_committed closes the effect/record gap down to one round trip: a kill after the mark
    # gives "outcome unknown" (reported), not a second order. A kill that lands inside that one
    # round trip (after the order's write, before the mark) runs the retry again: the documented
    # gap of a store that is not the data's database. It is rare (one round trip in each
    # request), never more than one order per kill, and every order is accounted for.
    assert report.duplicates <= report.kills
    assert report.orders == report.created + report.unknown + report.duplicates


@pytest.mark.chaos
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("mode", ["sqlite", "postgres", "mysql", "redis"])
def test_chaos_long_run(
    mode: str,
    demo_servers: Callable[..., DemoServer],
    tmp_path: Path,
    request: pytest.FixtureRequest,
    artifacts: None,
) -> None:
    plan = _long_plan()
    if mode == "sqlite":
        report = _sqlite_mode(demo_servers, tmp_path, plan)
    elif mode == "postgres":
        report = _postgres_mode(demo_servers, request, plan)
    elif mode == "mysql":
        report = _mysql_mode(demo_servers, request, plan)
    else:
        report = _redis_mode(demo_servers, tmp_path, plan)
    _report(report, f"{mode}-long")
    assert report.kills + report.service_faults == plan.kills
    if mode == "redis":
        assert report.lost == 0 and report.replay_mismatches == 0
        assert report.orders == report.created + report.unknown + report.duplicates
    else:
        _assert_exactly_once(report)
