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

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from ._core.call import KEY_ARGUMENT, ResultCodec
from ._core.config import IdempotencyConfig
from ._core.errors import (
    ConfigurationError,
    InProgressError,
    KeyReusedError,
    OutcomeUnknownError,
)
from .functions import IdempotentFunction, idempotent_function
from .stores import AsyncStore, Store

__all__ = ["Delivery", "MessageHandler"]

Status = Literal[
    "executed", "replayed", "in_progress", "store_unavailable", "key_reused", "outcome_unknown"
]

_REFUSED = (InProgressError, KeyReusedError, OutcomeUnknownError)


@dataclass(frozen=True, slots=True)
class Delivery:
    """What one delivery of a message came to, and what to tell the broker.

    Attributes:
        status: ``"executed"`` (the handler ran now), ``"replayed"`` (it ran before: the stored
            result), ``"in_progress"`` (another consumer is running it now),
            ``"store_unavailable"`` (the store failed, nothing ran or everything rolled back:
            the task shells' answer to a :class:`~retrysafe.StoreError`),
            ``"key_reused"`` (another message was handled with this key: a producer bug) or
            ``"outcome_unknown"`` (a consumer committed its effects and died before storing
            the result: an operator resolves it).
        result: the handler's result (``executed``, ``replayed``).
        retry_after: seconds after which a redelivery is likely to find the outcome
            (``in_progress``), or to find the store back (``store_unavailable``).
    """

    status: Status
    result: Any = None
    retry_after: int | None = None

    @property
    def ack(self) -> bool:
        """The message is handled: acknowledge it (delete it, commit its offset)."""
        return self.status in ("executed", "replayed")

    @property
    def retry(self) -> bool:
        """Another consumer runs it now, or the store failed: deliver it again later (after
        :attr:`retry_after`), never drop it."""
        return self.status in ("in_progress", "store_unavailable")

    @property
    def dead_letter(self) -> bool:
        """It can neither run nor be answered: set it aside for a person (dead-letter)."""
        return self.status in ("key_reused", "outcome_unknown")


def _refused(error: Exception) -> Delivery:
    if isinstance(error, InProgressError):
        return Delivery("in_progress", retry_after=error.retry_after)
    if isinstance(error, KeyReusedError):
        return Delivery("key_reused")
    return Delivery("outcome_unknown")


class MessageHandler:
    """A message handler that runs once per message key.

    Args:
        handler: the ``def`` or ``async def`` that handles one message; it is called with what
            :meth:`process` gets after the key (e.g. the body).
        store: a store URL or instance (see :func:`~retrysafe.idempotent_function`).
        name: what the keys are scoped by (default: the handler's qualified name): one name per
            stream of messages whose keys must not meet another's.
        fingerprint: the handler's parameter names that identify a message (default: all of
            them): the same key with another body is ``key_reused``, nothing runs.
        codec: how results are stored (``"json"``, ``"pickle"`` or a codec).
        final: exception types that are outcomes, stored and raised for every copy.
        config: an :class:`~retrysafe.IdempotencyConfig`, or its call options as keywords
            (``ttl`` is how long a key is remembered: longer than the broker may redeliver).
        **options: ``ttl``, ``lease``, ``on_conflict``, ``conflict_wait``, ``on_store_error``,
            ``transactional``, ``on_event``.

    Raises:
        ConfigurationError: a bad option, named (at construction).
    """

    def __init__(
        self,
        handler: Callable[..., Any],
        *,
        store: str | AsyncStore | Store,
        name: str | None = None,
        fingerprint: list[str] | tuple[str, ...] | None = None,
        codec: str | ResultCodec = "json",
        final: Iterable[type[BaseException]] = (),
        config: IdempotencyConfig | None = None,
        **options: Any,
    ) -> None:
        self.function: IdempotentFunction[..., Any] = idempotent_function(
            handler,
            store=store,
            name=name,
            fingerprint=fingerprint,
            codec=codec,
            final=final,
            config=config,
            **options,
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
        call, call_kwargs = self.function.prepare(args, {**kwargs, KEY_ARGUMENT: key})
        try:
            result = self.function.invoke(call, args, call_kwargs)
        except _REFUSED as error:
            return _refused(error)
        return Delivery("replayed" if call.replayed else "executed", result)

    async def aprocess(self, key: str | int, /, *args: Any, **kwargs: Any) -> Delivery:
        """:meth:`process` for an ``async def`` handler."""
        if not self.function.is_async:
            raise ConfigurationError("a def handler is run with: process(...)")
        call, call_kwargs = self.function.prepare(args, {**kwargs, KEY_ARGUMENT: key})
        try:
            pending: Awaitable[Any] = self.function.invoke(call, args, call_kwargs)
            result = await pending
        except _REFUSED as error:
            return _refused(error)
        return Delivery("replayed" if call.replayed else "executed", result)

    def close(self) -> None:
        """Close the store (a ``def`` handler's)."""
        self.function.close()

    async def aclose(self) -> None:
        """Close the store (an ``async def`` handler's)."""
        await self.function.aclose()
