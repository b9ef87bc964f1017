"""What every task queue's adapter shares (Celery, Dramatiq, and the next ones): a task's
function made idempotent (:func:`task_function`), the key a producer sends with a message
(:func:`message_key`, checked at send time), and the worker-start check of the queue's
redelivery rules against the lease and the record's TTL (:func:`redelivery_warnings`).

A delivery runs through :meth:`~retrysafe.calls.IdempotentFunction.deliver` with
``queue=True``, and comes to a :class:`~retrysafe.calls.Delivery`: ``executed`` or ``replayed``
(return the result), ``in_progress`` (a live worker runs the first copy: deliver this one again
after ``retry_after`` seconds; never run it, never drop it), ``store_unavailable`` (the store
failed: the same, after :data:`~retrysafe.calls.STORE_RETRY_AFTER` seconds; a task that failed
instead would be acknowledged and gone, as ``acks_late`` acknowledges failures). A key used with
other arguments and "outcome unknown" fail the task with their error
(:class:`~retrysafe.KeyReusedError`, :class:`~retrysafe.OutcomeUnknownError`), for a person to
look at: a task queue's dead letter.

The queues whose callers wait on the job's own result and that have no retry leaving the
attempt count alone (RQ, arq, taskiq) do not send such a copy back: it waits in the worker
(:func:`deliver_waiting`, :func:`adeliver_waiting`), looking at the key again every second,
until the first run's stored outcome answers it or its dead owner's key is taken over, bounded
by the job's own timeout.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import warnings
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .._core.call import check_key
from .._core.config import IdempotencyConfig
from .._core.errors import ConfigurationError, InvalidKeyError
from ..stores import AsyncStore, Store
from ._delivery import Delivery
from ._function import IdempotentFunction, make_function
from ._options import FunctionOptions

__all__ = [
    "KEY_HEADER",
    "WAIT_POLL",
    "Redelivery",
    "adeliver_waiting",
    "deliver_waiting",
    "message_key",
    "redelivery_warnings",
    "task_function",
    "warn_once",
]

#: The message header (Celery) or message option (Dramatiq) a producer puts the business key in.
KEY_HEADER = "idempotency_key"

#: The longest a copy waiting in the worker sleeps before it looks at the key again (one store
#: read): a copy of a short job is answered within a second of the first run's end.
WAIT_POLL = 1.0

logger = logging.getLogger("retrysafe")


def task_function(
    function: Callable[..., Any],
    store: str | AsyncStore | Store,
    options: FunctionOptions,
    *,
    where: str,
    is_async: bool = False,
) -> IdempotentFunction[..., Any]:
    """A task's function made idempotent: one run per key across deliveries and workers (named
    by default by its module and qualified name, which every worker shares).

    Args:
        is_async: the queue runs ``async def`` jobs (arq, taskiq), not ``def`` ones.

    Raises:
        ConfigurationError: an ``async def`` for a queue that calls functions, a ``def`` for an
            asyncio queue, or a bad option (at decoration, in the producer and the worker
            alike).
    """
    if inspect.iscoroutinefunction(function) != is_async:
        if is_async:
            raise ConfigurationError(f"{where}: an asyncio queue's job is an async def function")
        raise ConfigurationError(f"{where}: a task is a def function, not an async def")
    if options.get("name") is None:
        options = {**options, "name": f"{function.__module__}.{function.__qualname__}"}
    return make_function(function, store, options)


def _outcome(delivery: Delivery) -> Any:
    """The result of a delivery that is not to be retried, or its dead letter's error."""
    if delivery.dead_letter and delivery.error is not None:
        raise delivery.error  # the job fails, for a person to look at
    return delivery.result


def deliver_waiting(
    keyed: IdempotentFunction[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    key: object = None,
    fallback: object = None,
) -> Any:
    """Run one delivery of a ``def`` job to its outcome, waiting in the worker while a live
    run holds the key or the store fails.

    Args:
        args: the job's positional arguments.
        kwargs: its keyword arguments.
        key: the message's key, as :class:`~retrysafe.calls.DeliveryOptions` ``key``.
        fallback: the job's id, as :class:`~retrysafe.calls.DeliveryOptions` ``fallback``.

    Returns:
        The result, now or stored.

    Raises:
        KeyReusedError: the key was used with other arguments.
        OutcomeUnknownError: the first run committed its effects and died unrecorded.
        BaseException: what the function raised, or its stored final exception.
    """
    while True:
        delivery = keyed.deliver(args, kwargs, key=key, fallback=fallback, queue=True)
        if not delivery.retry:
            return _outcome(delivery)
        time.sleep(min(delivery.retry_after or 1, WAIT_POLL))


async def adeliver_waiting(
    keyed: IdempotentFunction[..., Awaitable[Any]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    key: object = None,
    fallback: object = None,
) -> Any:
    """:func:`deliver_waiting` for an ``async def`` job."""
    while True:
        delivery = await keyed.adeliver(args, kwargs, key=key, fallback=fallback, queue=True)
        if not delivery.retry:
            return _outcome(delivery)
        await asyncio.sleep(min(delivery.retry_after or 1, WAIT_POLL))


def message_key(key: object) -> str:
    """A business key as a producer sends it: checked now, so that a bad key fails the send
    rather than the task in the worker (where ``acks_late`` would acknowledge the failed message
    and it would never run).

    Raises:
        InvalidKeyError: not a ``str`` or ``int``, empty, or longer than 255 characters.
    """
    try:
        return check_key(key, "the task")
    except InvalidKeyError as exc:
        raise InvalidKeyError(f"idempotency_key(): {exc}") from None


@dataclass(frozen=True, slots=True)
class Redelivery:
    """What a queue does with a task that was delivered and not acknowledged, for the check.

    Attributes:
        queue: ``"Celery"`` or ``"Dramatiq"`` (for the messages).
        broker: the broker's name (``"redis"``, ``"amqp"``...).
        visibility_timeout: seconds after which the broker delivers an unacknowledged message
            again although its worker is alive (Redis and SQS brokers), else ``None``.
        acks_late: the message is acknowledged after the task ran (a killed worker's task comes
            back).
        reject_on_worker_lost: a task whose worker process died goes back to the queue.
    """

    queue: str
    broker: str
    visibility_timeout: float | None
    acks_late: bool = True
    reject_on_worker_lost: bool = True


def redelivery_warnings(
    redelivery: Redelivery, task: str, config: IdempotencyConfig, time_limit: float | None
) -> list[str]:
    """What in the queue's redelivery rules works against one idempotent task, in words.

    Args:
        redelivery: the queue's rules.
        task: the task's name.
        config: its idempotency settings (lease, TTL).
        time_limit: its hard time limit in seconds (``None``: none).

    Returns:
        One sentence per problem (empty: nothing to say).
    """
    out: list[str] = []
    where = f"{redelivery.queue} task {task}"
    vt = redelivery.visibility_timeout
    if vt is not None and (time_limit is None or time_limit > vt):
        limit = "no time limit" if time_limit is None else f"a time limit of {time_limit:g} s"
        out.append(
            f"{where}: the {redelivery.broker} broker's visibility_timeout is {vt:g} s and the "
            f"task has {limit}: a run longer than {vt:g} s is delivered again while it still "
            "runs. retrysafe never runs that copy (it is retried every few seconds until the "
            "first run ends, then answered from the stored result), but raise "
            "visibility_timeout above the longest run, or set time_limit below it, to avoid "
            "the extra deliveries"
        )
    if vt is not None and config.ttl <= vt:
        out.append(
            f"{where}: its ttl ({config.ttl:g} s) is not longer than the broker's "
            f"visibility_timeout ({vt:g} s): a copy delivered again after the record expired "
            "runs again; set ttl well above visibility_timeout"
        )
    if not redelivery.acks_late:
        out.append(
            f"{where}: the message is acknowledged before the task runs, so a killed worker's "
            "task is lost, not delivered again (retrysafe cannot bring it back); set "
            "acks_late=True"
        )
    elif not redelivery.reject_on_worker_lost:
        out.append(
            f"{where}: a task whose worker process is killed is marked failed, not delivered "
            "again; set task_reject_on_worker_lost=True (retrysafe runs the redelivered copy "
            "once, taking the dead worker's key over)"
        )
    return out


_warned: set[str] = set()


def warn_once(messages: Iterable[str]) -> None:
    """Each message as a ``RuntimeWarning`` and a log line (once per process)."""
    for message in messages:
        if message in _warned:
            continue
        _warned.add(message)
        logger.warning("%s", message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)
