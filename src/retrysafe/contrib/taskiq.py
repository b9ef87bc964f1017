"""taskiq tasks whose effect happens once per business key, across duplicate kicks, redeliveries
of unacknowledged messages and killed workers: a middleware and a decorator under
``@broker.task``::

    from taskiq_redis import RedisStreamBroker
    from retrysafe.contrib.taskiq import Idempotency, idempotency_key, idempotent_task

    broker = RedisStreamBroker("redis://localhost:6379", idle_timeout=30_000)
    broker.add_middlewares(Idempotency())

    @broker.task
    @idempotent_task(store="postgresql://localhost/shop", key="order_id")
    async def charge(order_id: str, amount: int) -> dict:
        ...

    await charge.kicker().with_labels(**idempotency_key("o-1")).kiq("o-1", 100)

The key is, in this order: the business key in the message's labels (:func:`idempotency_key`),
an ``idempotency_key=`` keyword argument, the decorator's ``key=`` (a parameter name or a
callable over the arguments), else the task's id (the same for every redelivery of one message).

Each message: the first runs the function and stores its result (its lease renewed while it
runs); a message whose key is complete returns the stored result without running (every
caller's ``wait_result()`` gets the first run's); one that finds a live worker running the key
waits (``asyncio.sleep``, a second at a time: no retry is spent) until the first run's result
answers it or its owner is found dead and it takes the key over. The broker must acknowledge
after the task (taskiq's default, ``when_saved``) and deliver an unacknowledged message again:
``RedisStreamBroker`` does after ``idle_timeout`` (10 minutes by default, also while the first
worker still runs: retrysafe never runs that copy). The middleware checks the broker when a
worker starts (a ``RuntimeWarning`` and a log line).
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, Unpack, overload

from ..calls import (
    KEY_HEADER,
    FunctionOptions,
    IdempotentFunction,
    adeliver_waiting,
    message_key,
    task_function,
    warn_once,
)
from ..stores import AsyncStore, Store
from ._extra import extra

with extra("taskiq"):
    from taskiq import TaskiqMessage, TaskiqMiddleware

__all__ = ["Idempotency", "idempotency_key", "idempotent_task"]

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

#: Brokers that take a message off the queue before it runs: a killed worker's is lost.
_NO_ACKS = {"ListQueueBroker", "PubSubBroker", "ListRedisScheduleSource", "InMemoryBroker"}

#: A redelivery delay past this many seconds leaves a killed worker's task waiting long.
SLOW_REDELIVERY = 120

_message: contextvars.ContextVar[TaskiqMessage | None] = contextvars.ContextVar(
    "retrysafe_taskiq_message", default=None
)
_keyed: dict[str, IdempotentFunction[..., Any]] = {}


def idempotency_key(key: str | int) -> dict[str, Any]:
    """The labels that carry a business key with the message:
    ``task.kicker().with_labels(**idempotency_key("order-1")).kiq(...)``.

    Raises:
        InvalidKeyError: the key is empty, longer than 255 characters, or not a ``str`` or
            ``int``: the kick fails, rather than the task in the worker.
    """
    return {KEY_HEADER: message_key(key)}


@overload
def idempotent_task(
    function: F, /, *, store: str | AsyncStore | Store, **options: Unpack[FunctionOptions]
) -> F: ...


@overload
def idempotent_task(
    function: None = None,
    /,
    *,
    store: str | AsyncStore | Store,
    **options: Unpack[FunctionOptions],
) -> Callable[[F], F]: ...


def idempotent_task(
    function: F | None = None,
    /,
    *,
    store: str | AsyncStore | Store,
    **options: Unpack[FunctionOptions],
) -> F | Callable[[F], F]:
    """Make a taskiq task's ``async def`` function run once per key; put it under
    ``@broker.task`` on a broker with the :class:`Idempotency` middleware.

    Args:
        function: the task's ``async def`` function (when used without options).
        store: a store URL or store: every worker must share it.
        **options: :class:`~retrysafe.calls.FunctionOptions`, as
            :func:`~retrysafe.idempotent_function` takes them: ``key`` (a parameter name,
            several, or a callable over the arguments; a key in the labels or an
            ``idempotency_key=`` argument wins; without any, the task's id), ``name`` (default:
            the function's module and qualified name), ``fingerprint``, ``codec``, ``final``,
            ``config`` or the call options (``ttl``: longer than the broker's redelivery;
            ``lease``, ``on_store_error``, ``transactional``, ``on_event``).

    Raises:
        ConfigurationError: a bad option, named (at import).
    """

    def decorate(target: F) -> F:
        where = f"idempotent_task({getattr(target, '__qualname__', target)})"
        keyed = task_function(target, store, options, where=where, is_async=True)
        _keyed[keyed.name] = keyed

        @functools.wraps(target)
        async def run(*args: Any, **kwargs: Any) -> Any:
            message = _message.get()
            if message is None:  # called directly, not by a worker (or no middleware)
                return await keyed(*args, **kwargs)
            header = message.labels.get(KEY_HEADER)
            return await adeliver_waiting(keyed, args, kwargs, key=header, fallback=message.task_id)

        run.retrysafe = keyed  # type: ignore[attr-defined]
        return run  # type: ignore[return-value]

    return decorate if function is None else decorate(function)


class Idempotency(TaskiqMiddleware):
    """Give the idempotent tasks the message they run for (its labels and id), and check the
    broker's redelivery when a worker starts."""

    def pre_execute(self, message: TaskiqMessage) -> TaskiqMessage:
        """Remember the message for the task about to run (in its own asyncio context)."""
        _message.set(message)
        return message

    def startup(self) -> None:
        """Check the broker (in a worker process)."""
        if getattr(self.broker, "is_worker_process", False):
            warn_once(self.check())

    def check(self) -> list[str]:
        """What in the broker's redelivery loses an idempotent task or runs it twice."""
        broker = self.broker
        kind = type(broker).__name__
        out: list[str] = []
        if kind in _NO_ACKS:
            out.append(
                f"taskiq broker {kind} takes a message off the queue before the task runs: a "
                "killed worker's task is lost, not delivered again (retrysafe cannot bring it "
                "back); use a broker that acknowledges (RedisStreamBroker, AioPikaBroker, "
                "NATS JetStream)"
            )
        idle = getattr(broker, "idle_timeout", None)
        if idle is None:
            return out
        if getattr(broker, "unacknowledged_lock_timeout", None) is None:
            out.append(
                f"taskiq broker {kind}: its reclaim lock has no timeout, so a worker killed "
                "while it takes unacknowledged messages over leaves the lock set, and no "
                "unacknowledged message is delivered again (taskiq-redis#131); set "
                "unacknowledged_lock_timeout (taskiq-redis 1.2 and later)"
            )
        delay = idle / 1000
        if delay > SLOW_REDELIVERY:
            out.append(
                f"taskiq broker {kind}: idle_timeout is {delay:g} s, so a killed worker's "
                f"task is delivered again only {delay:g} s later; lower it (idle_timeout=30_000: "
                "a copy delivered while the first still runs waits for its result, never runs)"
            )
        for name, keyed in _keyed.items():
            if keyed.config.ttl <= delay:
                out.append(
                    f"taskiq task {name}: its ttl ({keyed.config.ttl:g} s) is not longer than "
                    f"the broker's idle_timeout ({delay:g} s), after which an unacknowledged "
                    "message is delivered again: such a copy would run again"
                )
        return out
