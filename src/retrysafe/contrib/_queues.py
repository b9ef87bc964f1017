"""What the queue shells that wait in the worker share (:mod:`retrysafe.contrib.rq`, ``.arq``,
``.huey``, ``.taskiq``): one delivery of a job on :class:`~retrysafe.contrib._tasks.TaskFunction`
(its ``async def`` twin for the asyncio queues), and the wait of a copy that meets a live run.

These queues have no retry that leaves a job's attempt count alone (RQ's ``Retry`` and Huey's
``retries`` are spent by it, arq counts ``job_try``), and their callers wait on the job's own
result, so a copy that meets a live run (or a failing store) does not go back to the queue: it
looks again every second in the worker, until the first run's stored outcome answers it or its
dead owner's key is taken over, bounded by the job's own timeout. Everything else (keys,
leases, fencing, takeover, the stored result or final exception) is the task layer's.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

from .._core.call import KEY_ARGUMENT
from .._core.errors import ConfigurationError, InProgressError, StoreError
from ..consumer import Delivery
from ..functions import IdempotentFunction, idempotent_function
from ._tasks import IN_PROGRESS_RETRY_MAX, STORE_RETRY_AFTER, TaskFunction

__all__ = ["WAIT_POLL", "AsyncTaskFunction", "adeliver", "deliver", "keyed_function"]

#: The longest a copy waiting in the worker sleeps before it looks at the key again (one store
#: read): a copy of a short job is answered within a second of the first run's end.
WAIT_POLL = 1.0


def keyed_function(
    function: Callable[..., Any], *, where: str, name: str | None, **spec: Any
) -> TaskFunction | AsyncTaskFunction:
    """The job's function made idempotent: a ``def`` on the task layer, an ``async def`` on
    its twin."""
    if inspect.iscoroutinefunction(function):
        return AsyncTaskFunction(function, where=where, name=name, **spec)
    return TaskFunction(function, where=where, name=name, **spec)


def deliver(
    keyed: TaskFunction,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    key: object,
    fallback: str,
) -> Any:
    """Run one delivery of a ``def`` job to its outcome: the result (now or stored), or what
    the function or the key raised."""
    while True:
        delivery = keyed.run(args, kwargs, key=key, fallback=fallback)
        if not delivery.retry:
            return delivery.result
        time.sleep(min(delivery.retry_after or 1, WAIT_POLL))


async def adeliver(
    keyed: AsyncTaskFunction,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    key: object,
    fallback: str,
) -> Any:
    """:func:`deliver` for an ``async def`` job."""
    while True:
        delivery = await keyed.run(args, kwargs, key=key, fallback=fallback)
        if not delivery.retry:
            return delivery.result
        await asyncio.sleep(min(delivery.retry_after or 1, WAIT_POLL))


class AsyncTaskFunction:
    """:class:`~retrysafe.contrib._tasks.TaskFunction` for an ``async def`` job (arq, taskiq)."""

    def __init__(
        self, function: Callable[..., Any], *, where: str, name: str | None, **spec: Any
    ) -> None:
        if not inspect.iscoroutinefunction(function):
            raise ConfigurationError(f"{where}: an asyncio queue's job is an async def function")
        if name is None:
            name = f"{function.__module__}.{function.__qualname__}"
        self.function: IdempotentFunction[..., Any] = idempotent_function(
            function, name=name, **spec
        )

    @property
    def config(self) -> Any:
        """The function's settings (lease, TTL...)."""
        return self.function.config

    async def run(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        key: object = None,
        fallback: str | None = None,
    ) -> Delivery:
        """One delivery of the job (as :meth:`TaskFunction.run` of the task layer)."""
        if key is None and KEY_ARGUMENT not in kwargs and not self.function.computes_key:
            key = fallback
        if key is not None:
            kwargs = {**kwargs, KEY_ARGUMENT: key}
        call, call_kwargs = self.function.prepare(args, kwargs)
        try:
            result = await self.function.invoke(call, args, call_kwargs)
        except InProgressError as error:
            wait = min(max(1, error.retry_after or 1), IN_PROGRESS_RETRY_MAX)
            return Delivery("in_progress", retry_after=wait)
        except StoreError:
            return Delivery("store_unavailable", retry_after=STORE_RETRY_AFTER)
        return Delivery("replayed" if call.replayed else "executed", result)
