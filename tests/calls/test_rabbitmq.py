"""The RabbitMQ consumer example against a real broker: 60 messages (10 of them published twice
by the producer), consumers SIGKILLed twice while they work; every message's effect happens
once, and the messages delivered again after a kill are answered from the store."""

from __future__ import annotations

import contextlib
import json
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from ..conftest import RUN_ID, service_missing

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
MESSAGES = 60
DUPLICATED = 10
# Each consumer acknowledges every 50 messages, more than its share (the 70 deliveries are dealt
# round robin to two): a consumer killed mid-way has acknowledged none of what it handled, and a
# consumer running ahead of this test's reads cannot reach a batch's end before its kill.
BATCH = ("--ack-every", "50")


@pytest.fixture
def queue() -> Iterator[str]:
    """A queue of this test's own on the real broker, deleted afterwards."""
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=2).close()
    except OSError as exc:
        service_missing("RabbitMQ", f"127.0.0.1:5672 unreachable ({exc})")
    name = f"rs-test-{RUN_ID}-{uuid.uuid4().hex[:8]}"
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    connection.channel().queue_declare(queue=name, durable=True)
    connection.close()
    yield name
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    connection.channel().queue_delete(queue=name)
    connection.close()


def publish(queue: str) -> list[str]:
    """The producer: every order once, the first ``DUPLICATED`` twice (a retried publish)."""
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel = connection.channel()
    channel.confirm_delivery()
    ids = [f"charge-{i}" for i in range(MESSAGES)]
    for message_id in ids + ids[:DUPLICATED]:
        body = json.dumps({"order_id": message_id.removeprefix("charge-"), "amount": 100})
        properties = pika.BasicProperties(message_id=message_id, delivery_mode=2)
        channel.basic_publish("", queue, body.encode(), properties)
    connection.close()
    return ids


def wait_for_consumers(queue: str, count: int, timeout: float = 60.0) -> None:
    """Until ``count`` consumers are on the queue: then the broker deals messages to each in turn
    (published before, they would all go to whichever consumer came first)."""
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel = connection.channel()
    deadline = time.monotonic() + timeout
    while channel.queue_declare(queue=queue, passive=True).method.consumer_count < count:
        assert time.monotonic() < deadline, f"{count} consumers did not come in {timeout} s"
        time.sleep(0.05)
    connection.close()


class Consumer:
    """One ``examples/rabbitmq_consumer.py`` process; its lines are read as they come."""

    def __init__(self, queue: str, db: Path, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "examples/rabbitmq_consumer.py", "--url", AMQP_URL),
                *("--queue", queue, "--db", str(db), *extra),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []

    def read(self, count: int, timeout: float = 60.0) -> None:
        """Read until ``count`` deliveries were handled."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while len(self.lines) < count and time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"consumer ended: {self.proc.communicate()[1]}")
            self.lines.append(line.strip())
        assert len(self.lines) >= count

    def kill(self) -> None:
        self.proc.kill()
        assert self.proc.stdout is not None
        # Through the reader readline used (communicate would skip what it buffered).
        self.lines += self.proc.stdout.read().splitlines()  # handled before it died
        self.proc.communicate(timeout=30)


def test_each_message_has_one_effect_across_killed_consumers(queue: str, tmp_path: Path) -> None:
    db = tmp_path / "charges.db"
    consumers = [Consumer(queue, db, *BATCH), Consumer(queue, db, *BATCH)]  # sharing the queue
    try:
        wait_for_consumers(queue, 2)
        ids = publish(queue)
        consumers[0].read(15)
        consumers[0].kill()  # what it handled was not acknowledged: delivered again
        consumers[1].read(15)
        consumers[1].kill()
        last = Consumer(queue, db, "--idle-exit", "3")
        consumers.append(last)
        out, err = last.proc.communicate(timeout=120)
        assert last.proc.returncode == 0, err
        last.lines += out.splitlines()
    finally:
        for consumer in consumers:
            if consumer.proc.poll() is None:
                consumer.proc.kill()
                consumer.proc.communicate()
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT order_id, count(*) FROM charges GROUP BY order_id").fetchall()
    assert sorted(f"charge-{order}" for order, _ in rows) == sorted(ids)
    assert all(count == 1 for _, count in rows)  # one effect per message
    deliveries = [line.split() for c in consumers for line in c.lines]
    statuses = {status for _, status, _ in deliveries}
    # in_progress: the two consumers got the producer's two copies at once; the second copy
    # went back to the queue and was answered later (the queue ends empty, below).
    assert statuses <= {"executed", "replayed", "in_progress"}, deliveries
    # Delivered again after a kill (and by the producer's duplicates): answered, not re-run.
    assert any(s == "replayed" and r == "redelivered=True" for _, s, r in deliveries)
    assert sum(s == "replayed" for _, s, _ in deliveries) >= DUPLICATED, deliveries
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    left = connection.channel().queue_declare(queue=queue, passive=True).method.message_count
    connection.close()
    assert left == 0
