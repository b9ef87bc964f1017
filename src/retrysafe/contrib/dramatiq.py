"""Dramatiq actors whose effect happens once per business key, across redeliveries, producer
retries and killed workers: a middleware and an actor option::

    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
    from retrysafe.contrib.dramatiq import Idempotency, idempotency_key

    broker = RedisBroker(url="redis://localhost:6379/0")
    broker.add_middleware(Idempotency(store="postgresql://localhost/shop"))
    dramatiq.set_broker(broker)

    @dramatiq.actor(idempotent=True)              # or idempotent={"key": "order_id", ...}
    def charge(order_id: str, amount: int) -> None:
        ...

    charge.send_with_options(args=("o-1", 100), **idempotency_key("o-1"))

The key is, in this order: the business key in the message's options (:func:`idempotency_key`),
an ``idempotency_key=`` keyword argument, the actor option's ``key`` (a parameter name or a
callable over the arguments), else the message's id (the same for every redelivery of one
message). A delivery whose key is complete is answered from the stored result without running;
one that finds a live worker running the key is retried after a few seconds (Dramatiq's
``Retry``, not counted against ``max_retries``; the broker needs the Retries middleware, which
Dramatiq adds by default); one that finds a dead worker's key
takes it over. Works the same on the Redis and the RabbitMQ brokers (and any other).

The middleware must be added before the actors are declared (Dramatiq checks actor options
against the broker's middleware). ``idempotent=`` takes ``True`` or a dict of the options of
:func:`~retrysafe.idempotent_function` for that actor (``key``, ``name`` (default: the actor's
name), ``fingerprint``, ``codec``, ``final``, ``store``, ``ttl``, ``lease``, ``transactional``...).
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Unpack

from .._core.config import IdempotencyConfig
from .._core.errors import ConfigurationError
from ..calls import (
    KEY_HEADER,
    CallOptions,
    IdempotentFunction,
    Redelivery,
    message_key,
    redelivery_warnings,
    task_function,
    warn_once,
)
from ..stores import Store
from ._extra import extra

with extra("dramatiq"):
    from dramatiq.errors import Retry
    from dramatiq.middleware import Middleware, MiddlewareError, Retries

__all__ = ["ActorConfigurationError", "Idempotency", "idempotency_key"]


class ActorConfigurationError(ConfigurationError, MiddlewareError):
    """A bad ``idempotent=`` option: a :class:`~retrysafe.ConfigurationError` that Dramatiq
    lets through when an actor is declared (it logs and drops other middleware errors)."""


def idempotency_key(key: str | int) -> dict[str, Any]:
    """The ``send_with_options`` options that carry a business key with the message.

    ``actor.send_with_options(args=..., **idempotency_key("order-1"))``; ``send`` takes no
    options: pass ``idempotency_key=...`` as a keyword argument instead (taken off before the
    actor's function is called).

    Raises:
        InvalidKeyError: the key is empty, longer than 255 characters, or not a ``str`` or
            ``int``: the send fails, rather than the message in the worker.
    """
    return {KEY_HEADER: message_key(key)}


class Idempotency(Middleware):
    """Run the actors declared with ``idempotent=...`` once per key.

    Args:
        store: the store URL or synchronous store of every idempotent actor (an actor's
            ``idempotent={"store": ...}`` overrides it): every worker must share it.
        config: an :class:`~retrysafe.IdempotencyConfig`, or its call options as keywords.
        **options: defaults for every idempotent actor: ``ttl`` (longer than any
            redelivery), ``lease``, ``on_store_error``, ``transactional``, ``on_event``.

    Raises:
        ConfigurationError: a bad option, named (when an actor is declared).
    """

    def __init__(
        self,
        store: str | Store | None = None,
        *,
        config: IdempotencyConfig | None = None,
        **options: Unpack[CallOptions],
    ) -> None:
        self.store = store
        self.config = config
        self.options = options
        self._local = threading.local()
        self._keyed: dict[str, IdempotentFunction[..., Any]] = {}

    @property
    def actor_options(self) -> set[str]:
        """``idempotent``: ``True`` or a dict of options."""
        return {"idempotent"}

    def before_declare_actor(self, broker: Any, actor: Any) -> None:
        """Wrap an idempotent actor's function in its keyed run (the function is called by
        the actor as before; only the delivery's outcome changes).

        Raises:
            ActorConfigurationError: a bad option, named (the actor is not declared).
        """
        try:
            self._declare(broker, actor)
        except ConfigurationError as exc:
            raise ActorConfigurationError(str(exc), option=exc.option) from exc

    def _declare(self, broker: Any, actor: Any) -> None:
        spec = actor.options.get("idempotent")
        if not spec:
            return
        if spec is True:
            spec = {}
        if not isinstance(spec, dict):
            raise ConfigurationError(
                f"actor {actor.actor_name}: idempotent= takes True or a dict of options, "
                f"got {spec!r}"
            )
        options = dict(spec)
        store = options.pop("store", self.store)
        if store is None:
            raise ConfigurationError(
                f"actor {actor.actor_name}: no store (Idempotency(store=...) or "
                "idempotent={'store': ...})"
            )
        if options.get("config", self.config) is not None:
            options.setdefault("config", self.config)
        else:
            options = {**self.options, **options}
        if not any(isinstance(m, Retries) for m in broker.middleware):
            raise ConfigurationError(
                f"actor {actor.actor_name}: the broker has no Retries middleware, which sends a "
                "copy that met a running one again later (Dramatiq's default middleware has it)"
            )
        options.setdefault("name", actor.actor_name)
        keyed = task_function(actor.fn, store, options, where=f"actor {actor.actor_name}")  # type: ignore[arg-type]
        self._keyed[actor.actor_name] = keyed
        actor.fn = self._wrap(broker, actor.actor_name, actor.fn, keyed)

    def _wrap(self, broker: Any, name: str, fn: Any, keyed: IdempotentFunction[..., Any]) -> Any:
        local = self._local

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            message = getattr(local, "message", None)
            if message is None or message.actor_name != name:
                return keyed(*args, **kwargs)  # called directly, not from a worker
            key = message.options.get(KEY_HEADER)
            delivery = keyed.deliver(args, kwargs, key=key, fallback=message.message_id, queue=True)
            if delivery.dead_letter and delivery.error is not None:
                raise delivery.error  # the message fails, for a person to look at
            if not delivery.retry:
                return delivery.result
            # A live worker runs the first copy, or the store failed: this one comes back later
            # (the Retries middleware enqueues it with this delay), never runs now. Waiting for
            # another worker or the store is not a failed attempt: the count Retries is about
            # to raise stays.
            message.options["retries"] = message.options.get("retries", 0) - 1
            why = (
                "the first copy is still running"
                if delivery.status == "in_progress"
                else "the idempotency store is unavailable"
            )
            raise Retry(f"retrysafe: {why}", (delivery.retry_after or 1) * 1000)

        run.retrysafe = keyed  # type: ignore[attr-defined]
        return run

    def before_process_message(self, broker: Any, message: Any) -> None:
        """Remember the message being processed by this worker thread."""
        self._local.message = message

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        """Forget it."""
        self._local.message = None

    def after_skip_message(self, broker: Any, message: Any) -> None:
        """Forget it."""
        self._local.message = None

    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        """Check the broker's redelivery against each idempotent actor's settings."""
        warn_once(self.check(broker))

    def check(self, broker: Any) -> list[str]:
        """What in ``broker``'s redelivery rules works against an idempotent actor.

        Dramatiq's brokers deliver a message again only when its worker is gone (RabbitMQ: the
        connection closed; Redis: no heartbeat for ``heartbeat_timeout``), never while it runs,
        so only the record's TTL is checked against that delay.
        """
        kind = type(broker).__name__.removesuffix("Broker").lower() or "unknown"
        heartbeat = getattr(broker, "heartbeat_timeout", None)
        delay = None if heartbeat is None else heartbeat / 1000
        out: list[str] = []
        for name, keyed in self._keyed.items():
            rules = Redelivery("Dramatiq", kind, None)
            out += redelivery_warnings(rules, name, keyed.config, None)
            if delay is not None and keyed.config.ttl <= delay:
                out.append(
                    f"Dramatiq actor {name}: its ttl ({keyed.config.ttl:g} s) is not longer "
                    f"than the {kind} broker's heartbeat_timeout ({delay:g} s), after which a "
                    "dead worker's messages are delivered again: such a copy would run again"
                )
        return out
