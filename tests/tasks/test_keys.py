"""Where a task's key comes from, what a duplicate gets, and the worker-start check: an embedded
Celery worker on the in-memory transport and Dramatiq's stub broker with a real worker thread
(what a killed worker and a real broker do is in test_celery.py and test_dramatiq.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import types
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from dramatiq.brokers.stub import StubBroker
from dramatiq.results import Results
from dramatiq.results.backends import StubBackend

from retrysafe import ConfigurationError, IdempotencyConfig
from retrysafe.calls import Redelivery, redelivery_warnings
from retrysafe.contrib import celery as rs_celery
from retrysafe.contrib.celery import check_worker, idempotency_key, idempotent_task
from retrysafe.contrib.dramatiq import Idempotency
from retrysafe.contrib.dramatiq import idempotency_key as dramatiq_key


@pytest.fixture(scope="module")
def celery_app(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Celery, list[str], Any]]:
    """An app with a keyed task (``runs`` lists each run) and an embedded worker, for the
    module (each test its own keys)."""
    tmp_path = tmp_path_factory.mktemp("keys")
    app = Celery("tasks_keys", broker="memory://", backend="cache+memory://")
    app.conf.task_acks_late = True
    app.conf.task_default_queue = f"tasks_keys_{uuid.uuid4().hex[:8]}"  # memory:// is global
    runs: list[str] = []
    store = f"sqlite:///{tmp_path}/keys.db"

    @app.task(name=f"tasks_keys.charge_{uuid.uuid4().hex[:8]}", bind=True)
    @idempotent_task(store=store)
    def charge(self: Any, order_id: str, amount: int) -> dict[str, Any]:
        runs.append(order_id)
        return {"order_id": order_id, "amount": amount, "task": self.request.id}

    with start_worker(app, perform_ping_check=False, pool="solo", shutdown_timeout=10):
        yield app, runs, charge
        runs.clear()


def test_a_header_key_runs_the_task_once(celery_app: Any) -> None:
    _app, runs, charge = celery_app
    first = charge.apply_async(("o-1", 100), **idempotency_key("order-1")).get(timeout=10)
    again = charge.apply_async(("o-1", 100), **idempotency_key("order-1")).get(timeout=10)
    assert runs.count("o-1") == 1
    assert again == first  # the second message is answered with the stored result


def test_a_keyword_key_works_with_delay(celery_app: Any) -> None:
    _app, runs, charge = celery_app
    charge.delay("o-2", 100, idempotency_key="order-2").get(timeout=10)
    charge.delay("o-2", 100, idempotency_key="order-2").get(timeout=10)
    assert runs.count("o-2") == 1


def test_without_a_business_key_the_task_id_is_the_key(celery_app: Any) -> None:
    _app, runs, charge = celery_app
    task_id = f"fixed-{uuid.uuid4()}"
    charge.apply_async(("o-3", 100), task_id=task_id).get(timeout=10)
    charge.apply_async(("o-3", 100), task_id=task_id).get(timeout=10)  # a redelivery
    charge.delay("o-3", 100).get(timeout=10)  # another message: another task id
    assert runs.count("o-3") == 2


def test_a_copy_that_meets_a_running_task_is_retried_later_not_run(tmp_path: Any) -> None:
    """The second copy arrives while the first runs: it is sent again (same task id), and
    that copy gets the stored result; the function ran once."""
    app = Celery("tasks_busy", broker="memory://", backend="cache+memory://")
    app.conf.task_default_queue = f"tasks_busy_{uuid.uuid4().hex[:8]}"
    release = threading.Event()
    runs: list[str] = []

    @app.task(name=f"tasks_busy.slow_{uuid.uuid4().hex[:8]}")
    @idempotent_task(store=f"sqlite:///{tmp_path}/busy.db", key="order_id", lease=2)
    def slow(order_id: str) -> str:
        runs.append(order_id)
        release.wait(10)
        return "done"

    with start_worker(
        app, perform_ping_check=False, pool="threads", concurrency=2, shutdown_timeout=10
    ):
        first = slow.delay("o-5")
        second = slow.delay("o-5")
        threading.Timer(1.5, release.set).start()
        assert first.get(timeout=20) == "done"
        assert second.get(timeout=20) == "done"
    assert runs == ["o-5"]


@pytest.fixture
def redis_down_then_up(tmp_path: Path, redis_url: str) -> Iterator[tuple[str, threading.Timer]]:
    """A Redis store URL whose server is not running yet, and a timer (not started) that
    starts it on that port: the store is unreachable for the first deliveries."""
    from tests.stores.backend_redis import PrivateRedis

    server = PrivateRedis(tmp_path / "redis")
    timer = threading.Timer(1.5, server.start)
    try:
        yield server.url, timer
    finally:
        timer.cancel()
        if timer.ident is not None:
            timer.join()
        server.stop()


def test_a_task_that_meets_an_unreachable_store_comes_back_later_and_runs_once(
    redis_down_then_up: tuple[str, threading.Timer],
) -> None:
    """Fail closed, lose nothing: a failed task would be acknowledged and gone (acks_late
    acknowledges failures), so the delivery is sent again until the store answers."""
    store, start_redis = redis_down_then_up
    app = Celery("tasks_down", broker="memory://", backend="cache+memory://")
    app.conf.task_acks_late = True
    app.conf.task_default_queue = f"tasks_down_{uuid.uuid4().hex[:8]}"
    runs: list[str] = []

    @app.task(name=f"tasks_down.charge_{uuid.uuid4().hex[:8]}", max_retries=0)
    @idempotent_task(store=store, key="order_id")
    def charge(order_id: str) -> str:
        runs.append(order_id)
        return "charged"

    with start_worker(app, perform_ping_check=False, pool="solo", shutdown_timeout=10):
        first = charge.delay("o-1")
        start_redis.start()
        assert first.get(timeout=30, propagate=True) == "charged"
        assert charge.delay("o-1").get(timeout=30) == "charged"  # the stored result
    assert runs == ["o-1"]


def test_dramatiq_a_message_that_meets_an_unreachable_store_comes_back_later(
    redis_down_then_up: tuple[str, threading.Timer],
) -> None:
    store, start_redis = redis_down_then_up
    broker = StubBroker()
    broker.add_middleware(Results(backend=StubBackend()))
    broker.add_middleware(Idempotency(store=store))
    runs: list[str] = []

    @dramatiq.actor(
        broker=broker, store_results=True, idempotent={"key": "order_id"}, max_retries=0
    )
    def charge(order_id: str) -> str:
        runs.append(order_id)
        return "charged"

    worker = dramatiq.Worker(broker, worker_timeout=50)
    worker.start()
    try:
        message = charge.send("o-1")
        start_redis.start()
        backend = broker.get_results_backend()
        assert message.get_result(backend=backend, block=True, timeout=30_000) == "charged"
    finally:
        worker.stop()
        broker.close()
    assert runs == ["o-1"]


def test_a_copy_of_a_short_task_looks_again_within_seconds_not_a_lease(tmp_path: Path) -> None:
    """A copy that meets a live run comes back after a few seconds at most, not after the
    lease left (30 s by default): the first run of a short task is long done by then."""
    from retrysafe.calls import IN_PROGRESS_RETRY_MAX, task_function

    started, release = threading.Event(), threading.Event()

    def charge(order_id: str) -> str:
        started.set()
        release.wait(10)
        return order_id

    keyed = task_function(
        charge, f"sqlite:///{tmp_path}/c.db", {"name": "shop.charge", "key": "order_id"}, where="t"
    )
    first = threading.Thread(target=keyed.deliver, args=(("o-1",), {}), kwargs={"queue": True})
    first.start()
    try:
        assert started.wait(10)
        delivery = keyed.deliver(("o-1",), {}, queue=True)
    finally:
        release.set()
        first.join()
        keyed.close()
    assert delivery.status == "in_progress"
    assert delivery.retry_after is not None and 1 <= delivery.retry_after <= IN_PROGRESS_RETRY_MAX


def test_called_directly_the_task_needs_a_key(tmp_path: Any) -> None:
    app = Celery("tasks_direct", broker="memory://")

    @app.task(name="tasks_direct.add")
    @idempotent_task(store=f"sqlite:///{tmp_path}/d.db", key="a")
    def add(a: int, b: int) -> int:
        return a + b

    assert add(1, 2) == 3
    assert add(1, 2) == 3


def _app(broker: str, **conf: Any) -> Celery:
    app = Celery("tasks_check", broker=broker)
    app.conf.update(conf)
    return app


def test_the_worker_check_warns_of_a_visibility_timeout_shorter_than_a_run(tmp_path: Any) -> None:
    app = _app(
        "redis://127.0.0.1:6379/0",
        broker_transport_options={"visibility_timeout": 60},
        task_acks_late=True,
        task_reject_on_worker_lost=True,
    )

    @app.task(name="tasks_check.long", time_limit=300)
    @idempotent_task(store=f"sqlite:///{tmp_path}/c.db", key="a", ttl=30)
    def long(a: int) -> int:
        return a

    problems = check_worker(app)
    assert any("visibility_timeout is 60 s" in p and "time limit of 300 s" in p for p in problems)
    assert any("ttl (30 s) is not longer" in p for p in problems)
    with pytest.warns(RuntimeWarning, match="visibility_timeout"):
        rs_celery._on_worker_init(sender=types.SimpleNamespace(app=app))


@pytest.mark.parametrize(
    ("conf", "says"),
    [
        ({}, "set acks_late=True"),
        ({"task_acks_late": True}, "set task_reject_on_worker_lost=True"),
        ({"task_acks_late": True, "task_reject_on_worker_lost": True}, None),
    ],
    ids=["early-ack", "lost-worker-fails", "redelivered"],
)
def test_the_worker_check_warns_of_early_acks_and_lost_workers(
    conf: dict[str, bool], says: str | None, tmp_path: Any
) -> None:
    app = _app("amqp://guest:guest@127.0.0.1:5672//", **conf)
    name = f"tasks_check.early_{uuid.uuid4().hex[:8]}"

    @app.task(name=name)
    @idempotent_task(store=f"sqlite:///{tmp_path}/c.db", key="a")
    def early(a: int) -> int:
        return a

    # every app also has the tasks other tests declared (shared): this one's problems only
    problems = [p for p in check_worker(app) if f"{name}:" in p]
    if says is None:
        assert problems == []  # RabbitMQ: no visibility timeout
    else:
        assert len(problems) == 1 and says in problems[0]


def test_redelivery_rules_within_limits_say_nothing() -> None:
    rules = Redelivery("Celery", "redis", 3600.0)
    assert redelivery_warnings(rules, "t", IdempotencyConfig(), 600) == []


def test_an_async_def_task_is_refused() -> None:
    async def coro() -> None: ...

    with pytest.raises(ConfigurationError, match="not an async def"):
        idempotent_task(coro, store="memory://")


# -- Dramatiq ------------------------------------------------------------------------------------


@pytest.fixture
def stub(tmp_path: Any) -> Iterator[tuple[StubBroker, list[str], Any]]:
    broker = StubBroker()
    broker.add_middleware(Results(backend=StubBackend()))
    broker.add_middleware(Idempotency(store=f"sqlite:///{tmp_path}/d.db"))
    runs: list[str] = []

    @dramatiq.actor(
        broker=broker, actor_name="tasks_stub_charge", store_results=True, idempotent=True
    )
    def charge(order_id: str, amount: int) -> dict[str, Any]:
        runs.append(order_id)
        return {"order_id": order_id, "amount": amount}

    worker = dramatiq.Worker(broker, worker_timeout=50)
    worker.start()
    try:
        yield broker, runs, charge
    finally:
        worker.stop()
        broker.close()


def test_dramatiq_a_message_option_key_runs_the_actor_once(stub: Any) -> None:
    broker, runs, charge = stub
    first = charge.send_with_options(args=("o-1", 1), **dramatiq_key("order-1"))
    again = charge.send_with_options(args=("o-1", 1), **dramatiq_key("order-1"))
    broker.join(charge.queue_name)
    assert runs == ["o-1"]
    backend = broker.get_results_backend()
    assert again.get_result(backend=backend) == first.get_result(backend=backend)


def test_dramatiq_a_keyword_key_and_the_message_id(stub: Any) -> None:
    broker, runs, charge = stub
    charge.send("o-2", 1, idempotency_key="order-2")
    charge.send("o-2", 1, idempotency_key="order-2")
    message = charge.message("o-3", 1)
    broker.enqueue(message)
    broker.enqueue(message)  # a redelivery: the same message id
    broker.join(charge.queue_name)
    assert sorted(runs) == ["o-2", "o-3"]


def test_dramatiq_a_bad_option_is_named() -> None:
    broker = StubBroker()
    broker.add_middleware(Idempotency(store="memory://"))
    with pytest.raises(ConfigurationError, match="idempotent= takes True or a dict"):

        @dramatiq.actor(broker=broker, idempotent="yes")
        def bad() -> None: ...

    with pytest.raises(ConfigurationError, match="tll"):

        @dramatiq.actor(broker=broker, idempotent={"tll": 5})
        def typo() -> None: ...

    broker.close()


def test_dramatiq_check_compares_the_ttl_with_the_redelivery_delay() -> None:
    broker = StubBroker()
    middleware = Idempotency(store="memory://", ttl=30)
    broker.add_middleware(middleware)

    @dramatiq.actor(broker=broker, idempotent=True)
    def act() -> None: ...

    broker.heartbeat_timeout = 60_000  # what the Redis broker has
    assert any("heartbeat_timeout (60 s)" in p for p in middleware.check(broker))
    broker.heartbeat_timeout = 10_000
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        middleware.after_worker_boot(broker, None)
    broker.close()


def test_delay_on_commit_sends_after_the_commit_and_runs_once(
    request: pytest.FixtureRequest,
) -> None:
    """Django's ``delay_on_commit`` with ``idempotency_key=``: two sends in one committed
    transaction run once; a rolled-back transaction sends nothing."""
    request.getfixturevalue("postgres_url")
    done = subprocess.run(
        [sys.executable, "-m", "tests.tasks.on_commit"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == ["o-1"]


def test_sqlalchemy_writes_commit_with_the_task_record(tmp_path: Any) -> None:
    """Same-transaction mode in a worker: a SQLAlchemy session's row and the task's record
    commit together; a task that raises leaves neither (its redelivery runs it again)."""
    import sqlite3

    from sqlalchemy import text

    from retrysafe.contrib.sqlalchemy import call_session

    db = tmp_path / "tx.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE shipments (order_id TEXT)")
    app = Celery("tasks_sa", broker="memory://", backend="cache+memory://")
    app.conf.task_default_queue = f"tasks_sa_{uuid.uuid4().hex[:8]}"
    fail = {"o-2"}

    @app.task(name=f"tasks_sa.ship_{uuid.uuid4().hex[:8]}")
    @idempotent_task(store=f"sqlite:///{db}", key="order_id", transactional=True)
    def ship(order_id: str) -> str:
        session = call_session()
        session.execute(text("INSERT INTO shipments VALUES (:o)"), {"o": order_id})
        if order_id in fail:
            fail.discard(order_id)
            raise RuntimeError("crashed after the write")
        return order_id

    with start_worker(app, perform_ping_check=False, shutdown_timeout=10):
        assert ship.delay("o-1").get(timeout=10) == "o-1"
        assert ship.delay("o-1").get(timeout=10) == "o-1"  # answered: no second row
        with pytest.raises(RuntimeError):
            ship.delay("o-2").get(timeout=10)
        assert ship.delay("o-2").get(timeout=10) == "o-2"  # the write rolled back; runs again
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT order_id FROM shipments ORDER BY order_id").fetchall()
    assert rows == [("o-1",), ("o-2",)]


def test_dramatiq_a_copy_that_meets_a_running_actor_comes_back_later(tmp_path: Any) -> None:
    broker = StubBroker()
    broker.add_middleware(Results(backend=StubBackend()))
    broker.add_middleware(Idempotency(store=f"sqlite:///{tmp_path}/busy.db", lease=2))
    release = threading.Event()
    runs: list[str] = []

    @dramatiq.actor(broker=broker, store_results=True, idempotent={"key": "order_id"})
    def slow(order_id: str) -> str:
        runs.append(order_id)
        release.wait(10)
        return "done"

    worker = dramatiq.Worker(broker, worker_threads=2, worker_timeout=50)
    worker.start()
    try:
        first, second = slow.send("o-1"), slow.send("o-1")
        threading.Timer(1.5, release.set).start()
        backend = broker.get_results_backend()
        assert first.get_result(backend=backend, block=True, timeout=20_000) == "done"
        assert second.get_result(backend=backend, block=True, timeout=20_000) == "done"
    finally:
        worker.stop()
        broker.close()
    assert runs == ["o-1"]
