"""A NATS JetStream consumer whose every message has one effect, however often it is delivered.

JetStream delivers at least once: a message not acknowledged within the consumer's ``ack_wait``
is delivered again (to this consumer or another one of the same durable consumer), whether the
first consumer died or still works on it, and a producer that publishes again after the stream's
``duplicate_window`` sends it twice. Here each message charges an order (a row in ``charges``);
the charge and the record of the message commit in one SQLite transaction; a message whose key
was handled before is answered from the store and acknowledged without charging again, and one
that another consumer is charging right now is delivered again later (``nak`` with a delay)::

    pip install 'retrysafe[nats]'
    python examples/nats_consumer.py --stream CHARGES --subject charges --db charges.db

Each delivery prints one line: ``<message id> <executed|replayed|...> delivered=<count>``.
Messages are JSON ``{"order_id": str, "amount": int}`` published with a ``Nats-Msg-Id``
header: the message's key.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import time
from typing import Any

import nats

import retrysafe
from retrysafe.consumer import MessageHandler


async def charge(body: bytes) -> dict[str, Any]:
    """The effect: one row in ``charges``, on the message's transaction."""
    order = json.loads(body)
    connection = await retrysafe.transaction()
    cursor = connection.execute(
        "INSERT INTO charges (order_id, amount, charged_at) VALUES (?, ?, ?)",
        (order["order_id"], order["amount"], time.time()),
    )
    await asyncio.sleep(0.02)  # the payment provider's round trip
    return {"order_id": order["order_id"], "charge": cursor.lastrowid}


async def consume(args: argparse.Namespace) -> None:
    with sqlite3.connect(args.db) as db:
        db.execute(
            "CREATE TABLE IF NOT EXISTS charges (order_id TEXT, amount INTEGER, charged_at REAL)"
        )
    # The records live in the same SQLite file: the charge and its record commit together. A
    # consumer killed mid-message leaves its key to the next delivery after ``lease`` seconds.
    charges = MessageHandler(
        charge, store=f"sqlite:///{args.db}", transactional=True, lease=args.lease
    )
    client = await nats.connect(args.url)
    js = client.jetstream()
    subscription = await js.pull_subscribe(args.subject, durable=args.durable, stream=args.stream)
    quiet = 0.0
    try:
        while not (args.idle_exit and quiet >= args.idle_exit):
            try:
                messages = await subscription.fetch(batch=args.batch, timeout=1)
            except TimeoutError:  # nats-py raises its own (a subclass) or asyncio's
                quiet += 1
                continue
            quiet = 0.0
            for message in messages:
                key = (message.headers or {}).get("Nats-Msg-Id")
                if not key:  # no key, no deduplication: a producer bug, set aside
                    await message.term()
                    continue
                try:
                    delivery = await charges.aprocess(key, message.data)
                except Exception as exc:  # the handler failed: its key is free, deliver again
                    print(f"{key} failed: {exc}", flush=True)
                    await message.nak()
                    continue
                print(
                    f"{key} {delivery.status} delivered={message.metadata.num_delivered}",
                    flush=True,
                )
                if delivery.ack:
                    await message.ack()
                elif delivery.retry:  # another consumer is charging it now: later, not never
                    await message.nak(delay=delivery.retry_after or 1)
                else:  # key used for another message, or outcome unknown: a person looks
                    await message.term()
    finally:
        await client.drain()
        await charges.aclose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="nats://127.0.0.1:4222")
    parser.add_argument("--stream", default="CHARGES")
    parser.add_argument("--subject", default="charges")
    parser.add_argument("--durable", default="charger")
    parser.add_argument("--db", default="charges.db")
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--lease", type=float, default=10.0)
    parser.add_argument("--idle-exit", type=float, default=0.0, help="stop after N quiet seconds")
    asyncio.run(consume(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
