"""What a keyed Celery task costs over a bare one, on the same worker and broker::

    python bench/tasks.py                      # Redis broker; SQLite, PostgreSQL, Redis stores
    python bench/tasks.py --tasks 500 --json out.json

One ``celery worker`` (``--pool solo``: one task at a time, so the figure is the time a task
takes end to end, not a concurrency effect) serves two tasks that return a small dict: the bare
one and the same function under ``@idempotent_task`` with a business key. For each store, rounds
of ``--tasks`` tasks of each kind are sent back to back, interleaved (bare, keyed, bare...), and
each round is timed from the first send to the last result (Redis result backend). Milliseconds
per task, best round; the overhead is keyed minus bare. Every queue, key prefix and table it
makes is named ``bench_tasks_<id>`` and removed afterwards.

This file is also the worker's app (``celery -A tasks worker`` with ``bench/`` on the path),
configured by ``BENCH_TASKS_*`` environment variables.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from celery import Celery

from retrysafe.contrib.celery import idempotent_task

BROKER = os.environ.get("BENCH_TASKS_BROKER", "redis://127.0.0.1:6379/0")
QUEUE = os.environ.get("BENCH_TASKS_QUEUE", "bench_tasks")
STORE = os.environ.get("BENCH_TASKS_STORE", "memory://")

app = Celery("bench_tasks", broker=BROKER, backend=BROKER)
app.conf.update(
    task_default_queue=QUEUE,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=4,
    result_expires=600,
)


@app.task(name="bench_tasks.bare")
def bare(order_id: str, amount: int) -> dict[str, Any]:
    return {"order_id": order_id, "amount": amount}


@app.task(name="bench_tasks.keyed")
@idempotent_task(store=STORE, key="order_id", name="bench_tasks.keyed")
def keyed(order_id: str, amount: int) -> dict[str, Any]:
    return {"order_id": order_id, "amount": amount}


def _round(task: Any, count: int, tag: str) -> float:
    started = time.perf_counter()
    results = [task.delay(f"{tag}-{i}", 100) for i in range(count)]
    for result in results:
        result.get(timeout=120)
    return time.perf_counter() - started


def measure(store_url: str, label: str, tasks: int, rounds: int, run: str) -> dict[str, float]:
    """Milliseconds per task (best round) of the bare and the keyed task on ``store_url``."""
    queue = f"bench_tasks_{run}_{label}"
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).parent),
        "BENCH_TASKS_BROKER": BROKER,
        "BENCH_TASKS_QUEUE": queue,
        "BENCH_TASKS_STORE": store_url,
    }
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-P", "solo", "-Q", queue],
        cwd=Path(__file__).parent,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    app.conf.task_default_queue = queue
    try:
        _round(bare, 20, f"warm-{run}")  # the worker is up, connections are open
        _round(keyed, 20, f"warm-{run}")
        times: dict[str, list[float]] = {"bare": [], "keyed": []}
        for r in range(rounds):
            times["bare"].append(_round(bare, tasks, f"{run}-{r}"))
            times["keyed"].append(_round(keyed, tasks, f"{run}-{r}"))
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)
    found = {kind: round(min(found) / tasks * 1000, 3) for kind, found in times.items()}
    found["overhead"] = round(found["keyed"] - found["bare"], 3)
    print(f"{label}: bare {found['bare']} ms/task, keyed {found['keyed']} ms/task", flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--stores", default="sqlite,postgres,redis")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    run = uuid.uuid4().hex[:8]
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_tasks_") as tmp:
        urls = {
            "sqlite": f"sqlite:///{tmp}/bench.db",
            "postgres": f"{args.postgres_url}?table=bench_tasks_{run}",
            "redis": f"{args.redis_url}?prefix=bench_tasks_{run}:",
        }
        try:
            for store in args.stores.split(","):
                figures[f"redis broker, {store} store"] = measure(
                    urls[store], store, args.tasks, args.rounds, run
                )
        finally:
            with contextlib.suppress(Exception):
                import psycopg

                with psycopg.connect(args.postgres_url, autocommit=True) as conn:
                    conn.execute(f"DROP TABLE IF EXISTS bench_tasks_{run}")
            with contextlib.suppress(Exception):
                import redis

                client = redis.Redis.from_url(args.redis_url)
                for key in client.scan_iter(match=f"*bench_tasks_{run}*", count=1000):
                    client.delete(key)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out)


if __name__ == "__main__":
    main()
