"""The crash run of the task tests: real worker processes (``celery worker`` prefork, or
``dramatiq``), a real broker, a producer that sends some tasks twice, and workers SIGKILLed
(their whole process group, as a lost container) at random points and started again.

``python -m tests.tasks.crash --queue celery --broker redis --store postgres --kills 10``
prints one line per run: sends, duplicated sends, effects, duplicates, lost keys, replays, kills
that landed, and the p50/p99 time from a key's first send to its effect. The short tests
(``tests/tasks/test_*.py``) and ``make chaos-tasks`` call :func:`crash_run`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PG = os.environ.get("RETRYSAFE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS = os.environ.get("RETRYSAFE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
AMQP = os.environ.get("RETRYSAFE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


@dataclass
class Plan:
    """One crash run."""

    queue: str = "celery"  # celery | dramatiq
    broker: str = "redis"  # redis | rabbitmq
    store: str = "postgres"  # sqlite | postgres | redis | django | none (the control)
    tasks: int = 300
    duplicated: float = 0.2
    kills: int = 10
    workers: int = 3
    concurrency: int = 2
    work: float = 0.2
    visibility_timeout: float = 1.0
    seed: int = 1
    timeout: float = 240.0
    aimed: bool = False  # each kill waits for a job to start and kills the worker running it


@dataclass
class Outcome:
    """What a crash run came to."""

    plan: Plan
    sends: int = 0
    effects: int = 0
    keys: int = 0
    replays: int = 0
    unknown: int = 0
    kills: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # each lost key and what its record holds
    undelivered: int = 0  # lost keys no worker ever started a delivery of (the broker lost them)

    @property
    def duplicates(self) -> int:
        return self.effects - self.keys

    @property
    def lost(self) -> int:
        return self.plan.tasks - self.keys

    def percentile(self, p: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]

    def line(self) -> str:
        p = self.plan
        return (
            f"{p.queue:8} {p.broker:8} {p.store:8} tasks={p.tasks} sends={self.sends} "
            f"kills={self.kills} effects={self.effects} duplicates={self.duplicates} "
            f"lost={self.lost} undelivered={self.undelivered} replays={self.replays} "
            f"unknown={self.unknown} "
            f"p50={self.percentile(50):.2f}s p99={self.percentile(99):.2f}s run={self.seconds:.1f}s"
            + "".join(f"\n  lost {line}" for line in self.missing)
        )


def _mode(store: str) -> str:
    return {"sqlite": "tx", "postgres": "tx", "django": "django", "redis": "commit"}.get(
        store, "plain"
    )


class Setup:
    """The run's store, effects table, queue and worker environment (all named ``tasks_<id>``)."""

    def __init__(self, plan: Plan, tmp: Path) -> None:
        self.plan = plan
        self.id = uuid.uuid4().hex[:10]
        self.queue = f"tasks_{self.id}"
        self.table = f"tasks_fx_{self.id}"
        self.events = tmp / "events.log"
        self.events.write_text("")
        self.sqlite = tmp / "store.db"
        mode = _mode(plan.store)
        store = {
            "sqlite": f"sqlite:///{self.sqlite}",
            "postgres": f"{PG}?table=tasks_rec_{self.id}",
            "redis": f"{REDIS}?prefix=tasks_{self.id}:",
            "django": "django",
            "none": "none",
        }[plan.store]
        broker = REDIS if plan.broker == "redis" else AMQP
        self.env = {
            # not the Django settings tests/django may have set in this process: Celery's
            # Django fix-up would load them in every worker
            **{k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
            "PYTHONPATH": str(ROOT),
            "TASKS_BROKER": broker,
            "TASKS_QUEUE": self.queue,
            "TASKS_VT": str(plan.visibility_timeout),
            "TASKS_STORE": store,
            "TASKS_MODE": mode,
            "TASKS_TABLE": self.table,
            "TASKS_EFFECTS": PG,
            "TASKS_EVENTS": str(self.events),
            "TASKS_WORK": str(plan.work),
            "TASKS_PREFIX": f"tasks_{self.id}:",
        }
        self.broker = broker
        self.task_name = "tasks.charge" if plan.queue == "celery" else "tasks_charge"
        if plan.store == "django":
            self.schema = f"tasks_dj_{self.id}"
            self.table = f"{self.schema}.tasks_fx_{self.id}"
            self.env["TASKS_TABLE"] = self.table
            self.env["TASKS_DJANGO_SCHEMA"] = self.schema
            import psycopg

            with psycopg.connect(PG, autocommit=True) as conn:
                conn.execute(f"CREATE SCHEMA {self.schema}")
            env = {**self.env, "DJANGO_SETTINGS_MODULE": "tests.tasks.django_settings"}
            subprocess.run(
                [sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"],
                cwd=ROOT,
                env=env,
                check=True,
            )
        if plan.store == "sqlite":
            with sqlite3.connect(self.sqlite) as conn:
                conn.execute(f"CREATE TABLE {self.table} (key TEXT, pid INT, at REAL)")
        else:
            import psycopg

            with psycopg.connect(PG, autocommit=True) as conn:
                conn.execute(f"CREATE TABLE {self.table} (key text, pid int, at float8)")

    def rows(self) -> list[tuple[str, float]]:
        if self.plan.store == "sqlite":
            with sqlite3.connect(self.sqlite, timeout=30) as conn:
                return conn.execute(f"SELECT key, at FROM {self.table}").fetchall()
        import psycopg

        with psycopg.connect(PG, autocommit=True) as conn:
            return conn.execute(f"SELECT key, at FROM {self.table}").fetchall()  # type: ignore[return-value]

    def events_count(self) -> int:
        """The deliveries that came to an outcome (executed, replayed, outcome unknown)."""
        return sum(map(self.count, ("executed", "replayed", "outcome_unknown")))

    def received(self, key: str) -> bool:
        """Whether a worker ever started a delivery of ``key`` (Celery's ``task_prerun``)."""
        return f"received {key}\n" in self.events.read_text()

    def count(self, event: str) -> int:
        return self.events.read_text().split().count(event)

    def drop(self) -> None:
        try:
            import psycopg

            with psycopg.connect(PG, autocommit=True) as conn:
                conn.execute(f"DROP TABLE IF EXISTS {self.table}")
                conn.execute(f"DROP TABLE IF EXISTS tasks_rec_{self.id}")
                conn.execute(f"DROP SCHEMA IF EXISTS tasks_dj_{self.id} CASCADE")
        except Exception:
            pass
        if self.plan.broker == "rabbitmq":
            try:
                import pika

                conn = pika.BlockingConnection(pika.URLParameters(AMQP))
                channel = conn.channel()
                for name in (self.queue, f"{self.queue}.DQ", f"{self.queue}.XQ"):
                    channel.queue_delete(queue=name)
                conn.close()
            except Exception:
                pass
        try:
            import redis

            client = redis.Redis.from_url(REDIS)
            for key in client.scan_iter(match=f"*tasks_{self.id}*", count=1000):
                client.delete(key)
        except Exception:
            pass


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid`` (read before a kill: a killed parent's children move)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                for child in map(int, f.read().split()):
                    out += [child, *descendants(child)]
    return out


def running(setup: Setup, workers: list[Any], wait: float = 30.0) -> Any:
    """The worker whose process runs a job that started after this call (a ``working <pid>``
    event: see :func:`tests.tasks.effects.working`), or ``None`` if none starts in ``wait``."""
    offset = setup.events.stat().st_size
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        with open(setup.events) as f:
            f.seek(offset)
            text = f.read()
        for line in text[: text.rfind("\n") + 1].splitlines():
            if line.startswith("working "):
                pid = int(line.split()[1])
                for worker in workers:
                    if pid == worker.proc.pid or pid in descendants(worker.proc.pid):
                        return worker
        time.sleep(0.02)
    return None


class Worker:
    """One worker (its own process group: a SIGKILL takes the main process and its children)."""

    def __init__(self, setup: Setup, index: int) -> None:
        plan = setup.plan
        if plan.queue == "celery":
            command = [
                *(sys.executable, "-m", "celery", "-A", "tests.tasks.celery_app", "worker"),
                *("-P", "prefork", "-c", str(plan.concurrency), "-Q", setup.queue),
                *("-n", f"tasks{index}-{setup.id}@%h", "--without-gossip"),
                *("--without-mingle", "--without-heartbeat", "-l", "error"),
            ]
        else:
            command = [
                *(sys.executable, "-m", "dramatiq", "tests.tasks.dramatiq_app"),
                *("-p", "1", "-t", str(plan.concurrency), "-Q", setup.queue),
            ]
        self.command = command
        self.setup = setup
        self.log = open(Path(setup.events).with_name(f"worker{index}.log"), "a")  # noqa: SIM115
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.command,
            cwd=ROOT,
            env=self.setup.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            self.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # children left behind
        self.log.close()


def _producer(setup: Setup) -> Any:
    plan = setup.plan
    if plan.queue == "celery":
        from celery import Celery

        app = Celery("tasks_producer", broker=setup.broker)
        app.conf.broker_transport_options = {
            "visibility_timeout": plan.visibility_timeout,
            "global_keyprefix": setup.env["TASKS_PREFIX"],
        }

        def send(key: str) -> None:
            app.send_task("tasks.charge", args=(key, 100), queue=setup.queue)

        def close_app() -> None:
            app.pool.force_close_all()
            app.close()

        return send, close_app
    import dramatiq

    if plan.broker == "redis":
        from dramatiq.brokers.redis import RedisBroker

        broker: Any = RedisBroker(url=setup.broker, namespace=setup.env["TASKS_PREFIX"].rstrip(":"))
    else:
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        broker = RabbitmqBroker(url=setup.broker)
    broker.declare_queue(setup.queue)

    def send_message(key: str) -> None:
        message = dramatiq.Message(
            queue_name=setup.queue,
            actor_name="tasks_charge",
            args=(key, 100),
            kwargs={},
            options={},
        )
        broker.enqueue(message)

    return send_message, broker.close


def describe_lost(setup: Setup, key: str) -> str:
    """A lost key and its record in the store (none: no delivery ever reserved it, so the broker
    lost every copy; in progress: whose lease, committed or not)."""
    store_url = setup.env["TASKS_STORE"]
    if store_url in ("none", "django"):
        return key
    from retrysafe._core.call import call_record_id
    from retrysafe.ops.records import describe
    from retrysafe.stores import store_from_url

    store = store_from_url(store_url)
    try:
        rid = call_record_id(setup.task_name, key)
        seen = [
            line.split()[0]
            for line in setup.events.read_text().splitlines()
            if line.endswith(rid[:16])
        ]
        return (
            f"{key}: "
            + "; ".join(describe(rid, store.get(rid), function=setup.task_name))
            + f"; deliveries that reported: {', '.join(seen) or 'none'}"
            + ("" if setup.plan.queue != "celery" else f"; started: {setup.received(key)}")
        )
    except Exception as exc:  # a diagnosis, never the run's failure
        return f"{key}: record not read ({exc!r})"
    finally:
        with contextlib.suppress(Exception):
            store.close()


def crash_run(plan: Plan, tmp: Path) -> Outcome:
    """Run ``plan``: start the workers, send the tasks, kill and restart workers, wait for every
    key's effect (and, with retrysafe, every send's answer), then count."""
    rng = random.Random(plan.seed)
    setup = Setup(plan, tmp)
    outcome = Outcome(plan)
    workers = [Worker(setup, i) for i in range(plan.workers)]
    sent_at: dict[str, float] = {}
    started = time.monotonic()
    try:
        send, close = _producer(setup)
        keys = [f"order-{i}" for i in range(plan.tasks)]
        again = set(rng.sample(keys, int(plan.tasks * plan.duplicated)))
        order = keys + list(again)
        rng.shuffle(order)
        expected_run = plan.tasks * plan.work / (plan.workers * plan.concurrency) + 3

        def killer() -> None:
            for _ in range(plan.kills):
                if plan.aimed:
                    time.sleep(rng.uniform(0.3, 1.5))
                    victim = running(setup, workers) or rng.choice(workers)
                else:
                    time.sleep(rng.uniform(0.3, 2 * expected_run / max(1, plan.kills)))
                    victim = rng.choice(workers)
                victim.kill()
                outcome.kills += 1
                victim.start()

        chaos = threading.Thread(target=killer, daemon=True)
        time.sleep(2.0 if plan.queue == "celery" else 1.0)  # workers up before the first kill
        chaos.start()
        for key in order:
            sent_at.setdefault(key, time.time())
            send(key)
            outcome.sends += 1
            time.sleep(0.002)
        chaos.join()
        deadline = time.monotonic() + plan.timeout
        rows: list[tuple[str, float]] = []
        quiet_since = time.monotonic()
        last = -1
        while time.monotonic() < deadline:
            rows = setup.rows()
            done = len({k for k, _ in rows}) == plan.tasks
            if plan.store != "none":
                # Every copy sent twice answered (a redelivery of a run a kill cut off after its
                # commit is a replay too, so count the copies, not the events: a replay that
                # came early must not end the run while a copy still waits out a dead worker).
                answered = setup.count("replayed") + setup.count("outcome_unknown")
                done = (
                    done
                    and setup.events_count() >= outcome.sends
                    and answered >= outcome.sends - plan.tasks
                )
            if len(rows) != last:
                last, quiet_since = len(rows), time.monotonic()
            if done and time.monotonic() - quiet_since > 1.0:
                break
            # Every key's effect is there; a copy still unanswered may be waiting out a dead
            # worker's key (Redis: its heartbeat, then the retry's countdown) before its replay.
            # RQ: a worker killed after it took a job and before it started it leaves the job in
            # RQ's intermediate queue, which its maintenance hands back after a minute.
            patience = 90 if plan.queue == "rq" else 30
            if (
                len({k for k, _ in rows}) == plan.tasks
                and time.monotonic() - quiet_since > patience
            ):
                break
            if plan.store == "none" and time.monotonic() - quiet_since > 15:
                break  # the control: what has not happened by now is lost
            time.sleep(0.25)
        close()
        first: dict[str, float] = {}
        for key, at in rows:
            first[key] = min(at, first.get(key, at))
        outcome.effects = len(rows)
        outcome.keys = len(first)
        outcome.latencies = [first[k] - sent_at[k] for k in first]
        outcome.replays = setup.count("replayed")
        outcome.unknown = setup.count("outcome_unknown")
        outcome.seconds = time.monotonic() - started
        lost = [k for k in keys if k not in first]
        outcome.missing = [describe_lost(setup, k) for k in lost]
        if plan.queue == "celery":
            outcome.undelivered = sum(not setup.received(k) for k in lost)
        return outcome
    finally:
        for worker in workers:
            worker.stop()
        setup.drop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    for name, default in vars(Plan()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    args = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tasks_crash_") as tmp:
        print(crash_run(Plan(**vars(args)), Path(tmp)).line(), flush=True)


if __name__ == "__main__":
    main()
