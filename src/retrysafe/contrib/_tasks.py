"""What the task-queue shells share (:mod:`retrysafe.contrib.celery` and
:mod:`retrysafe.contrib.dramatiq`): a task's function run once per key on
:func:`~retrysafe.idempotent_function`'s core, and the worker-start check of the queue's
redelivery rules against the lease and the record's TTL.

A delivery comes to a :class:`~retrysafe.consumer.Delivery`, as a hand-written consumer's does:
``executed`` or ``replayed`` (return the result), ``in_progress`` (a live worker runs the first
copy: deliver this one again after ``retry_after`` seconds; never run it, never drop it),
``store_unavailable`` (the store failed: the same, after :data:`STORE_RETRY_AFTER` seconds; a
task that failed instead would be acknowledged and gone, as ``acks_late`` acknowledges
failures). A key
used with other arguments and "outcome unknown" raise (:class:`~retrysafe.KeyReusedError`,
:class:`~retrysafe.OutcomeUnknownError`): the task fails, for a person to look at.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .._core.call import KEY_ARGUMENT
from .._core.config import IdempotencyConfig
from .._core.errors import ConfigurationError, InProgressError, StoreError
from ..consumer import Delivery
from ..functions import IdempotentFunction, idempotent_function

__all__ = [
    "IN_PROGRESS_RETRY_MAX",
    "KEY_HEADER",
    "STORE_RETRY_AFTER",
    "Redelivery",
    "TaskFunction",
    "redelivery_warnings",
    "warn_once",
]

#: The message header (Celery) or message option (Dramatiq) a producer puts the business key in.
KEY_HEADER = "idempotency_key"

logger = logging.getLogger("retrysafe")

#: Seconds after which a delivery that met a failing store comes back.
STORE_RETRY_AFTER = 2

#: The longest a copy that met a running task waits before it comes back to look again.
IN_PROGRESS_RETRY_MAX = 5


class TaskFunction:
    """A task's function made idempotent: one run per key across deliveries and workers.

    Args:
        function: the task's ``def`` function (``async def`` is refused: task queues call
            functions).
        where: how errors name it (``idempotent_task(charge)``).
        name: what the keys are scoped by (default: the function's module and qualified name).
        **spec: :func:`~retrysafe.idempotent_function`'s other arguments (``store``, ``key``,
            ``fingerprint``, ``codec``, ``final``, ``config`` and the call options).

    Raises:
        ConfigurationError: a bad option (at decoration, in the producer and the worker alike).
    """

    def __init__(
        self, function: Callable[..., Any], *, where: str, name: str | None, **spec: Any
    ) -> None:
        if inspect.iscoroutinefunction(function):
            raise ConfigurationError(f"{where}: a task is a def function, not an async def")
        if name is None:
            name = f"{function.__module__}.{function.__qualname__}"
        self.function: IdempotentFunction[..., Any] = idempotent_function(
            function, name=name, **spec
        )

    @property
    def config(self) -> IdempotencyConfig:
        """The function's settings (lease, TTL...)."""
        return self.function.config

    def run(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        key: object = None,
        fallback: str | None = None,
    ) -> Delivery:
        """One delivery of the task: its stored outcome, or the function run now.

        Args:
            args: the task's positional arguments.
            kwargs: its keyword arguments (with ``idempotency_key=`` when the producer put the
                key there).
            key: the business key from the message (a header, a message option), if any: it
                wins over the arguments.
            fallback: the key when neither the message nor the arguments give one (the task's
                id: the same for every redelivery of one message).

        Raises:
            KeyReusedError: the key was used with other arguments.
            OutcomeUnknownError: the first run committed its effects and died unrecorded.
            BaseException: what the function raised (its key is freed: the next delivery runs it).
        """
        if key is None and KEY_ARGUMENT not in kwargs and not self.function.computes_key:
            key = fallback
        if key is not None:
            kwargs = {**kwargs, KEY_ARGUMENT: key}
        call, call_kwargs = self.function.prepare(args, kwargs)
        try:
            result = self.function.invoke(call, args, call_kwargs)
        except InProgressError as error:
            # The error's retry_after is the HTTP answer's (the lease left, or the usual run
            # time once known): a copy of a short task would wait a whole lease. A queue polls
            # cheaply, so a copy looks again after a few seconds at the most.
            wait = min(max(1, error.retry_after or 1), IN_PROGRESS_RETRY_MAX)
            return Delivery("in_progress", retry_after=wait)
        except StoreError:
            # Fail closed (the default): nothing ran unprotected, and a failure after the run is
            # one a retry may meet (writes rolled back with the record, or the key kept as
            # outcome unknown). The core has logged it (``store_error``).
            return Delivery("store_unavailable", retry_after=STORE_RETRY_AFTER)
        return Delivery("replayed" if call.replayed else "executed", result)


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
