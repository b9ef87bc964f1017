"""The NATS JetStream consumer example against a real server: 30 messages (5 published again
after the stream's duplicate window), a consumer SIGKILLed while it works through a batch; its
unacknowledged messages come back after ``ack_wait`` to the next consumer, and every message's
effect happens once."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import RUN_ID

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
NATS_URL = "nats://127.0.0.1:4222"
MESSAGES = 30
REPUBLISHED = 5


@pytest.fixture
def stream(nats_url: str) -> Iterator[tuple[str, str]]:
    """A stream and a durable pull consumer (``ack_wait`` 2 s) of this test's own."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

    name = f"RS_{RUN_ID}_{uuid.uuid4().hex[:8]}"

    async def declare() -> None:
        client = await nats.connect(NATS_URL)
        js = client.jetstream()
        await js.add_stream(StreamConfig(name=name, subjects=[name], duplicate_window=1.0))
        config = ConsumerConfig(durable_name="charger", ack_policy=AckPolicy.EXPLICIT, ack_wait=2)
        await js.add_consumer(name, config)
        await client.close()

    async def delete() -> None:
        client = await nats.connect(NATS_URL)
        await client.jetstream().delete_stream(name)
        await client.close()

    asyncio.run(declare())
    yield name, name
    asyncio.run(delete())


async def publish(subject: str) -> list[str]:
    """Every order once; after the duplicate window, the first ``REPUBLISHED`` again (a producer
    that retried late: JetStream's own deduplication no longer sees it)."""
    import nats

    client = await nats.connect(NATS_URL)
    js = client.jetstream()
    ids = [f"charge-{i}" for i in range(MESSAGES)]

    async def send(message_id: str) -> None:
        body = json.dumps({"order_id": message_id.removeprefix("charge-"), "amount": 100})
        await js.publish(subject, body.encode(), headers={"Nats-Msg-Id": message_id})

    for message_id in ids:
        await send(message_id)
    await asyncio.sleep(1.5)
    for message_id in ids[:REPUBLISHED]:
        await send(message_id)
    await client.close()
    return ids


class Consumer:
    """One ``examples/nats_consumer.py`` process; its lines are read as they come."""

    def __init__(self, stream: str, db: Path, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "examples/nats_consumer.py", "--url", NATS_URL),
                *("--stream", stream, "--subject", stream, "--db", str(db), "--lease", "3"),
                *extra,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []

    def read(self, count: int, timeout: float = 60.0) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while len(self.lines) < count and time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"consumer ended: {self.proc.communicate()[1]}")
            self.lines.append(line.strip())

    def kill(self) -> None:
        self.proc.kill()
        assert self.proc.stdout is not None
        self.lines += self.proc.stdout.read().splitlines()
        self.proc.communicate(timeout=30)


@pytest.mark.timeout(120)
def test_each_message_has_one_effect_across_a_killed_consumer(
    stream: tuple[str, str], tmp_path: Path
) -> None:
    name, _ = stream
    db = tmp_path / "charges.db"
    ids = asyncio.run(publish(name))
    first = Consumer(name, db, "--batch", "10")
    consumers = [first]
    try:
        first.read(5)
        first.kill()  # mid-batch: the rest of its batch is unacknowledged
        last = Consumer(name, db, "--idle-exit", "5")
        consumers.append(last)
        out, err = last.proc.communicate(timeout=90)
        assert last.proc.returncode == 0, err
        last.lines += out.splitlines()
    finally:
        for consumer in consumers:
            if consumer.proc.poll() is None:
                consumer.proc.kill()
                consumer.proc.communicate()
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT order_id, count(*) FROM charges GROUP BY order_id").fetchall()
    assert sorted(f"charge-{order}" for order, _ in rows) == sorted(ids)
    assert all(count == 1 for _, count in rows)  # one effect per message
    deliveries = [line.split() for c in consumers for line in c.lines]
    assert {status for _, status, _ in deliveries} <= {"executed", "replayed", "in_progress"}
    # the killed consumer's batch came back after ack_wait to the next one
    assert any(n != "delivered=1" for _, _, n in deliveries), deliveries
    assert sum(s == "replayed" for _, s, _ in deliveries) >= REPUBLISHED, deliveries
