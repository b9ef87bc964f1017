"""Huey tasks whose effect happens once per business key, across duplicate enqueues, retries and
tasks enqueued again after a killed consumer: a decorator under ``@huey.task()``::

    from huey import RedisHuey
    from retrysafe.contrib.huey import idempotent_task

    huey = RedisHuey("shop")

    @huey.task(retries=3)
    @idempotent_task(huey, store="postgresql://localhost/shop", key="order_id")
    def charge(order_id: str, amount: int) -> dict:
        ...

    charge("o-1", 100)                       # or charge("o-1", 100, idempotency_key="o-1")

The key is, in this order: an ``idempotency_key=`` keyword argument, the decorator's ``key=``
(a parameter name or a callable over the arguments), else the task's id (the same for every
retry of one task).

Each task: the first runs the function and stores its result (its lease renewed while it runs);
a task whose key is complete returns the stored result without running (its caller's
``result()`` is the first run's); one that finds a live consumer running the key raises Huey's
``RetryTask`` with a delay of a few seconds (the same task, its id and result handle, comes back
later; Huey does not count it against ``retries``), never runs and is never dropped; one that
finds a dead consumer's key takes it over and runs.

Huey takes a task off the queue before it runs it and has no acknowledgement: a task whose
consumer is killed is not delivered again. Enqueue it again (with the same key: it runs once,
taking the dead consumer's key over, or is answered from the stored result if the first run
finished). The consumer's start (``on_startup``) warns where Huey's settings lose results the
copies are answered with.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, Unpack

from ..calls import FunctionOptions, IdempotentFunction, task_function, warn_once
from ..stores import Store

try:
    from huey import Huey
    from huey.exceptions import RetryTask
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("retrysafe.contrib.huey needs: pip install 'retrysafe[huey]'") from exc

__all__ = ["check_huey", "idempotent_task"]

P = ParamSpec("P")
R = TypeVar("R")

#: The task each consumer worker runs now (set by the ``pre_execute`` hook).
_running = threading.local()
_hooked: dict[int, list[IdempotentFunction[..., Any]]] = {}


def idempotent_task(
    huey: Huey, /, *, store: str | Store, **options: Unpack[FunctionOptions]
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Make a Huey task's function run once per key; put it under ``@huey.task()``.

    Args:
        huey: the Huey instance the task is registered on (its ``pre_execute``,
            ``post_execute`` and ``on_startup`` hooks are added once).
        store: a store URL or a synchronous store: every consumer must share it.
        **options: :class:`~retrysafe.calls.FunctionOptions`, as
            :func:`~retrysafe.idempotent_function` takes them: ``key`` (a parameter name,
            several, or a callable over the arguments; an ``idempotency_key=`` argument wins;
            without any, the task's id), ``name`` (default: the function's module and qualified
            name), ``fingerprint``, ``codec``, ``final``, ``config`` or the call options
            (``ttl``: longer than any re-enqueue; ``lease``, ``on_store_error``,
            ``transactional``, ``on_event``).

    Raises:
        ConfigurationError: a bad option, named (at import, in producers and consumers alike).
    """

    def decorate(target: Callable[P, R]) -> Callable[P, R]:
        where = f"idempotent_task({getattr(target, '__qualname__', target)})"
        keyed = task_function(target, store, options, where=where)
        _hook(huey).append(keyed)

        @functools.wraps(target)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            task = getattr(_running, "task", None)
            if task is None:  # called directly (or by Huey's immediate mode without hooks)
                return keyed(*args, **kwargs)  # type: ignore[no-any-return]
            delivery = keyed.deliver(args, kwargs, fallback=task.id, queue=True)
            if delivery.dead_letter and delivery.error is not None:
                raise delivery.error  # the task fails, for a person to look at
            if not delivery.retry:
                return delivery.result  # type: ignore[no-any-return]
            # A live consumer runs the first copy, or the store failed: this task comes back
            # later (Huey's RetryTask leaves its retries alone), never runs now.
            raise RetryTask(delay=delivery.retry_after or 1)

        run.retrysafe = keyed  # type: ignore[attr-defined]
        return run

    return decorate


def _hook(huey: Huey) -> list[IdempotentFunction[..., Any]]:
    """The idempotent tasks of ``huey``, its hooks added on the first."""
    keyed = _hooked.get(id(huey))
    if keyed is not None:
        return keyed
    keyed = _hooked[id(huey)] = []

    def started(task: Any) -> None:
        _running.task = task

    def ended(task: Any, value: Any, exception: Any) -> None:
        _running.task = None

    def check() -> None:
        warn_once(check_huey(huey))

    huey.pre_execute(name="retrysafe")(started)
    huey.post_execute(name="retrysafe")(ended)
    huey.on_startup(name="retrysafe")(check)
    return keyed


def check_huey(huey: Huey) -> list[str]:
    """What in ``huey``'s settings works against its idempotent tasks (run by each consumer at
    start, ``on_startup``)."""
    out: list[str] = []
    if not huey.results and _hooked.get(id(huey)):
        out.append(
            f"Huey {huey.name}: results=False: a copy of an idempotent task is answered with "
            "the first run's result, but no caller can read it; keep results=True"
        )
    return out
