"""A RabbitMQ consumer whose every message has one effect, however often it is delivered.

RabbitMQ delivers at least once: a consumer that dies before acknowledging gets its messages
delivered again to the next one, and a producer that retries a publish sends a message twice.
Here each message charges an order (a row in ``charges``); the charge and the record of the
message commit in one SQLite transaction, and a message whose key was handled before is answered
from the store and acknowledged without charging again.

The consumer acknowledges in batches (every ``--ack-every`` messages, and whenever the queue goes
quiet), as consumers do for throughput: a crash then leaves up to a batch of handled messages
unacknowledged, and the broker delivers them again to the next consumer::

    pip install 'retrysafe[amqp]'
    python examples/rabbitmq_consumer.py --queue charges --db charges.db

Each delivery prints one line: ``<message id> <executed|replayed|...> redelivered=<bool>``.
Messages are JSON ``{"order_id": str, "amount": int}`` with the producer's ``message_id``.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import time
from typing import Any

import pika

from retrysafe import functions
from retrysafe.consumer import MessageHandler


def charge(body: bytes) -> dict[str, Any]:
    """The effect: one row in ``charges``, on the message's transaction."""
    order = json.loads(body)
    cursor = functions.transaction().execute(
        "INSERT INTO charges (order_id, amount, charged_at) VALUES (?, ?, ?)",
        (order["order_id"], order["amount"], time.time()),
    )
    time.sleep(0.02)  # the payment provider's round trip
    return {"order_id": order["order_id"], "charge": cursor.lastrowid}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/%2F")
    parser.add_argument("--queue", default="charges")
    parser.add_argument("--db", default="charges.db")
    parser.add_argument("--ack-every", type=int, default=10)
    parser.add_argument("--idle-exit", type=float, default=0.0, help="stop after N quiet seconds")
    args = parser.parse_args(argv)

    with sqlite3.connect(args.db) as db:
        db.execute(
            "CREATE TABLE IF NOT EXISTS charges (order_id TEXT, amount INTEGER, charged_at REAL)"
        )
    # The records live in the same SQLite file: the charge and its record commit together.
    charges = MessageHandler(charge, store=f"sqlite:///{args.db}", transactional=True)

    connection = pika.BlockingConnection(pika.URLParameters(args.url))
    channel = connection.channel()
    channel.queue_declare(queue=args.queue, durable=True)
    channel.basic_qos(prefetch_count=2 * args.ack_every)
    unacked = 0  # handled messages not acknowledged yet (up to the last delivery tag)
    last_tag = 0
    quiet = 0.0
    for method, properties, body in channel.consume(args.queue, inactivity_timeout=0.5):
        if method is None:  # the queue is quiet: acknowledge what was handled
            if unacked:
                channel.basic_ack(last_tag, multiple=True)
                unacked = 0
            quiet += 0.5
            if args.idle_exit and quiet >= args.idle_exit:
                break
            continue
        quiet = 0.0
        if not properties.message_id:  # no key, no deduplication: a producer bug, set aside
            channel.basic_reject(method.delivery_tag, requeue=False)
            continue
        try:
            delivery = charges.process(properties.message_id, body)
        except Exception as exc:  # the handler failed: its key is free, deliver it again
            print(f"{properties.message_id} failed: {exc}", flush=True)
            channel.basic_nack(method.delivery_tag, requeue=True)
            continue
        print(
            f"{properties.message_id} {delivery.status} redelivered={method.redelivered}",
            flush=True,
        )
        if delivery.ack:
            unacked += 1
            last_tag = method.delivery_tag
            if unacked >= args.ack_every:
                channel.basic_ack(last_tag, multiple=True)
                unacked = 0
        elif delivery.retry:  # another consumer is charging it right now: later, not never
            time.sleep(min(delivery.retry_after or 1, 1))
            channel.basic_nack(method.delivery_tag, requeue=True)
        else:  # the key was used for another message, or the outcome is unknown: a person looks
            channel.basic_reject(method.delivery_tag, requeue=False)
    channel.cancel()
    connection.close()
    charges.close()


if __name__ == "__main__":
    main()
