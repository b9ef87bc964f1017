"""Run a hand-written consumer's message handler once per message key (Kafka, NATS, RabbitMQ,
SQS...): a message delivered again (a redelivery after a killed consumer, a producer that sent it
twice) has one effect.

Brokers deliver at least once; the handler runs once per key, on the guarantees of
:func:`~retrysafe.idempotent_function` (leases, fencing, takeover from a dead consumer, the stored
result for a duplicate, "outcome unknown" after committed effects, and the same-transaction mode
with a SQL store). Each delivery gets a :class:`Delivery` that says what to tell the broker::

    from retrysafe.consumer import MessageHandler

    def charge(body: bytes) -> dict: ...           # the effect

    charges = MessageHandler(charge, store="postgresql://...")

    def on_message(channel, method, properties, body):    # pika
        delivery = charges.process(properties.message_id, body)
        if delivery.ack:
            channel.basic_ack(method.delivery_tag)
        elif delivery.retry:                               # the first copy still runs
            channel.basic_nack(method.delivery_tag, requeue=True)
        else:                                              # key reused, outcome unknown
            channel.basic_reject(method.delivery_tag, requeue=False)   # dead-letter it

=====================  ==============  ===================  =================  ==================
:class:`Delivery`      RabbitMQ        Kafka                NATS JetStream     SQS
=====================  ==============  ===================  =================  ==================
``ack``                ``basic_ack``   commit the offset    ``ack()``          ``delete_message``
``retry``              ``basic_nack``  do not commit; seek  ``nak(delay=``     change visibility
                       (requeue)       back after           ``retry_after)``   to ``retry_after``
                                       ``retry_after``
``dead_letter``        ``basic_reject  to a dead-letter     ``term()``         to the DLQ (or
                       (requeue=       topic, then commit                      leave it for the
                       False)``                                                redrive policy)
handler raised         ``basic_nack``  do not commit        ``nak()``          leave it (it comes
                       (requeue)                                               back after the
                                                                               visibility timeout)
=====================  ==============  ===================  =================  ==================

What the handler raises propagates (its key is freed, so the redelivery runs it again), unless
its type is in ``final``: then the exception is the stored outcome, raised again for every copy
of the message (ack or dead-letter it as your handler's errors say).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Unpack

from ._core.errors import ConfigurationError
from .calls import Delivery, HandlerOptions, IdempotentFunction, idempotent_function
from .stores import AsyncStore, Store

__all__ = ["Delivery", "MessageHandler"]


class MessageHandler:
    """A message handler that runs once per message key.

    Args:
        handler: the ``def`` or ``async def`` that handles one message; it is called with what
            :meth:`process` gets after the key (e.g. the body).
        store: a store URL or instance (see :func:`~retrysafe.idempotent_function`).
        **options: :class:`~retrysafe.calls.HandlerOptions`: ``name`` (what the keys are
            scoped by; default: the handler's qualified name: one name per stream of messages
            whose keys must not meet another's), ``fingerprint`` (the handler's parameter names
            that identify a message, default all: the same key with another body is
            ``key_reused``, nothing runs), ``codec``, ``final`` (exception types that are
            outcomes, stored and raised for every copy), ``config`` or the call options
            (``ttl``: how long a key is remembered, longer than the broker may redeliver;
            ``lease``, ``on_conflict``, ``conflict_wait``, ``on_store_error``,
            ``transactional``, ``on_event``).

    Raises:
        ConfigurationError: a bad option, named (at construction).
    """

    def __init__(
        self,
        handler: Callable[..., Any],
        *,
        store: str | AsyncStore | Store,
        **options: Unpack[HandlerOptions],
    ) -> None:
        self.function: IdempotentFunction[..., Any] = idempotent_function(
            handler, store=store, **options
        )

    def process(self, key: str | int, /, *args: Any, **kwargs: Any) -> Delivery:
        """Handle one delivery of a ``def`` handler's message.

        Args:
            key: the message's key (a business key, the producer's message id; never a
                broker's delivery tag or offset, which change on redelivery).
            *args: what the handler is called with (e.g. the body).
            **kwargs: the same, by name.

        Returns:
            What the delivery came to (see :class:`Delivery`).

        Raises:
            StoreError: the store failed (``on_store_error="fail_closed"``): deliver it again.
            ConfigurationError: the handler is an ``async def`` (use :meth:`aprocess`).
            BaseException: what the handler raised.
        """
        if self.function.is_async:
            raise ConfigurationError("an async def handler is run with: await aprocess(...)")
        return self.function.deliver(args, kwargs, key=key)

    async def aprocess(self, key: str | int, /, *args: Any, **kwargs: Any) -> Delivery:
        """:meth:`process` for an ``async def`` handler."""
        if not self.function.is_async:
            raise ConfigurationError("a def handler is run with: process(...)")
        return await self.function.adeliver(args, kwargs, key=key)

    def close(self) -> None:
        """Close the store (a ``def`` handler's)."""
        self.function.close()

    async def aclose(self) -> None:
        """Close the store (an ``async def`` handler's)."""
        await self.function.aclose()
