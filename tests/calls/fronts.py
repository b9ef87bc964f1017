"""The call fronts the contract suite (``test_contract.py``) runs over, one class each.

Adding a front (a queue, a consumer) to the suite is one class here and one ``pytest.param`` in
:data:`FRONTS`; the class answers the :class:`CallFront` protocol:

- ``define(body, store=..., **options)``: make ``body`` (a ``def`` function) idempotent on this
  front, the way its users write it (a decorator, a task, an actor option, a handler), with the
  options every call front takes (:class:`retrysafe.calls.FunctionOptions`); return a handle.
- ``send(handle, key, *args)``: one delivery of a message (or one call) carrying ``key`` and
  ``args``, through the front's own machinery (the task queue's executor, worker and
  middleware); return a :class:`Sent`: the value the caller gets, or the error the delivery ended
  in (a consumer's dead letter is its ``Delivery.error``).
- ``returns_results``: whether a caller gets the stored result of a duplicate (``False`` for a
  queue without a result backend: the suite then checks effects only).
- ``close()``: close stores, workers and loops.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pytest

import retrysafe
from retrysafe.consumer import MessageHandler


@dataclass
class Sent:
    """What one delivery came to: ``value`` for the caller, or ``error``."""

    value: Any = None
    error: BaseException | None = None


class CallFront(Protocol):
    id: str
    returns_results: bool

    def define(self, body: Callable[..., Any], *, store: str, **options: Any) -> Any: ...

    def send(self, handle: Any, key: str, *args: Any) -> Sent: ...

    def close(self) -> None: ...


def _sent(run: Callable[[], Any]) -> Sent:
    try:
        return Sent(run())
    except Exception as error:
        return Sent(error=error)


class DefFront:
    """``@idempotent_function`` over a ``def``; the key as ``idempotency_key=``."""

    id = "def"
    returns_results = True

    def __init__(self) -> None:
        self.handles: list[Any] = []

    def define(self, body: Callable[..., Any], *, store: str, **options: Any) -> Any:
        handle = retrysafe.idempotent_function(body, store=store, **options)
        self.handles.append(handle)
        return handle

    def send(self, handle: Any, key: str, *args: Any) -> Sent:
        return _sent(lambda: handle(*args, idempotency_key=key))

    def close(self) -> None:
        for handle in self.handles:
            handle.close()


class AsyncDefFront:
    """``@idempotent_function`` over an ``async def`` with ``body``'s signature, awaited on one
    event loop."""

    id = "async-def"
    returns_results = True

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.handles: list[Any] = []

    def define(self, body: Callable[..., Any], *, store: str, **options: Any) -> Any:
        @functools.wraps(body)
        async def target(*args: Any, **kwargs: Any) -> Any:
            return body(*args, **kwargs)

        handle = retrysafe.idempotent_function(target, store=store, **options)
        self.handles.append(handle)
        return handle

    def send(self, handle: Any, key: str, *args: Any) -> Sent:
        return _sent(lambda: self.loop.run_until_complete(handle(*args, idempotency_key=key)))

    def close(self) -> None:
        for handle in self.handles:
            self.loop.run_until_complete(handle.aclose())
        self.loop.close()


class ConsumerFront:
    """``MessageHandler(body).process(key, *args)``; a dead letter is its delivery's error."""

    id = "consumer"
    returns_results = True

    def __init__(self) -> None:
        self.handles: list[MessageHandler] = []

    def define(self, body: Callable[..., Any], *, store: str, **options: Any) -> Any:
        options.pop("key", None)  # a message's key comes with the message
        handle = MessageHandler(body, store=store, **options)
        self.handles.append(handle)
        return handle

    def send(self, handle: Any, key: str, *args: Any) -> Sent:
        def run() -> Any:
            delivery = handle.process(key, *args)
            if delivery.dead_letter or delivery.retry:
                assert delivery.error is not None
                raise delivery.error
            return delivery.result

        return _sent(run)

    def close(self) -> None:
        for handle in self.handles:
            handle.close()


class CeleryFront:
    """``@app.task`` over ``@idempotent_task``, run by Celery's own executor (``apply``: a
    request with an id, as a worker runs it); the key in the message's headers."""

    id = "celery"
    returns_results = True

    def __init__(self) -> None:
        self.celery = pytest.importorskip("retrysafe.contrib.celery")
        from celery import Celery

        self.app = Celery(f"contract-{uuid.uuid4().hex[:8]}", broker="memory://")
        self.stores: list[Any] = []
        self.names = itertools.count()

    def define(self, body: Callable[..., Any], *, store: str, **options: Any) -> Any:
        keyed = self.celery.idempotent_task(body, store=store, **options)
        self.stores.append(keyed.retrysafe.store)
        return self.app.task(name=f"contract.{next(self.names)}")(keyed)

    def send(self, handle: Any, key: str, *args: Any) -> Sent:
        result = handle.apply(args, **self.celery.idempotency_key(key))
        if result.failed():
            return Sent(error=result.result)
        return Sent(result.result)

    def close(self) -> None:
        for store in self.stores:
            store.close()


class DramatiqFront:
    """``@dramatiq.actor(idempotent={...})`` on a broker with the ``Idempotency`` middleware,
    processed by a Dramatiq worker; the key in the message's options. A caller sees no value
    (Dramatiq's results backend carries JSON only, not the typed result the suite returns): the
    suite checks effects, and errors as a middleware sees them."""

    id = "dramatiq"
    returns_results = False

    def __init__(self) -> None:
        dramatiq = pytest.importorskip("dramatiq")
        self.contrib = pytest.importorskip("retrysafe.contrib.dramatiq")
        from dramatiq.brokers.stub import StubBroker
        from dramatiq.middleware import Middleware

        seen: dict[str, BaseException | None] = {}

        class Outcomes(Middleware):  # type: ignore[misc]
            def after_process_message(
                self, broker: Any, message: Any, *, result: Any = None, exception: Any = None
            ) -> None:
                seen[message.message_id] = exception

        self.dramatiq = dramatiq
        self.seen = seen
        self.broker = StubBroker()
        self.broker.add_middleware(Outcomes())
        self.broker.add_middleware(self.contrib.Idempotency())
        self.worker = dramatiq.Worker(self.broker, worker_threads=1, worker_timeout=50)
        self.worker.start()
        self.names = itertools.count()
        self.stores: list[Any] = []

    def define(self, body: Callable[..., Any], *, store: str, **options: Any) -> Any:
        actor = self.dramatiq.actor(
            body,
            broker=self.broker,
            actor_name=f"contract_{next(self.names)}",
            max_retries=0,
            idempotent={"store": store, **options},
        )
        self.stores.append(actor.fn.retrysafe.store)
        return actor

    def send(self, handle: Any, key: str, *args: Any) -> Sent:
        message = handle.send_with_options(args=args, **self.contrib.idempotency_key(key))
        self.broker.join(handle.queue_name, fail_fast=False)
        self.worker.join()
        return Sent(error=self.seen[message.message_id])

    def close(self) -> None:
        self.worker.stop()
        self.broker.close()
        for store in self.stores:
            store.close()


class HueyFront:
    """``@huey.task()`` over ``@idempotent_task(huey, ...)`` on an immediate-mode Huey (its own
    executor, hooks and result store, in this process); the key as ``idempotency_key=``. A
    failed task's error is the one Huey signals (``SIGNAL_ERROR``)."""

    id = "huey"
    returns_results = True

    def __init__(self) -> None:
        self.contrib = pytest.importorskip("retrysafe.contrib.huey")
        from huey import MemoryHuey, signals

        self.huey = MemoryHuey(f"contract-{uuid.uuid4().hex[:8]}", immediate=True)
        self.errors: dict[str, BaseException] = {}

        def failed(signal: str, task: Any, exc: BaseException | None = None) -> None:
            assert exc is not None
            self.errors[task.id] = exc

        self.huey.signal(signals.SIGNAL_ERROR)(failed)
        self.names = itertools.count()
        self.stores: list[Any] = []

    def define(self, body: Callable[..., Any], *, store: str, **options: Any) -> Any:
        keyed = self.contrib.idempotent_task(self.huey, store=store, **options)(body)
        self.stores.append(keyed.retrysafe.store)
        return self.huey.task(name=f"contract_{next(self.names)}")(keyed)

    def send(self, handle: Any, key: str, *args: Any) -> Sent:
        result = handle(*args, idempotency_key=key)
        error = self.errors.pop(result.id, None)
        if error is not None:
            return Sent(error=error)
        return Sent(result.get())

    def close(self) -> None:
        for store in self.stores:
            store.close()


class TaskiqFront:
    """``@broker.task`` over ``@idempotent_task`` (an ``async def`` with ``body``'s signature)
    on taskiq's in-memory broker with the ``Idempotency`` middleware: kicked with the key in
    the message's labels, run by taskiq's receiver, the caller's ``wait_result()``."""

    id = "taskiq"
    returns_results = True

    def __init__(self) -> None:
        self.contrib = pytest.importorskip("retrysafe.contrib.taskiq")
        from taskiq import InMemoryBroker

        self.broker = InMemoryBroker()
        self.broker.add_middlewares(self.contrib.Idempotency())
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.broker.startup())
        self.names = itertools.count()
        self.stores: list[Any] = []

    def define(self, body: Callable[..., Any], *, store: str, **options: Any) -> Any:
        @functools.wraps(body)
        async def target(*args: Any, **kwargs: Any) -> Any:
            return body(*args, **kwargs)

        keyed = self.contrib.idempotent_task(target, store=store, **options)
        self.stores.append(keyed.retrysafe.store)
        return self.broker.task(task_name=f"contract_{next(self.names)}")(keyed)

    def send(self, handle: Any, key: str, *args: Any) -> Sent:
        async def kick() -> Any:
            kicker = handle.kicker().with_labels(**self.contrib.idempotency_key(key))
            sent = await kicker.kiq(*args)
            return await sent.wait_result(timeout=30)

        result = self.loop.run_until_complete(kick())
        if result.is_err:
            return Sent(error=result.error)
        return Sent(result.return_value)

    def close(self) -> None:
        for store in self.stores:
            self.loop.run_until_complete(store.aclose())
        self.loop.run_until_complete(self.broker.shutdown())
        self.loop.close()


def _redis() -> tuple[str, str]:
    """The real Redis's URL and a name unique to one front's keys (they carry the run's id, so
    the session's end deletes what a failed test left); skip without Redis (fail in CI)."""
    from ..conftest import REDIS_URL, RUN_ID, _reachable, service_missing

    problem = _reachable(REDIS_URL, 6379)
    if problem is not None:
        service_missing("Redis", problem)
    return REDIS_URL, f"{RUN_ID}-{uuid.uuid4().hex[:8]}"


class RQFront:
    """``@idempotent_job`` run by an RQ ``SimpleWorker`` in this process (RQ's own executor and
    job context; a burst per delivery) on the real Redis; the key in the job's ``meta``. RQ
    imports a job's function by name: each is registered on this module. A failed job's error
    is the one RQ's exception handler is given; its result is ``job.return_value()``."""

    id = "rq"
    returns_results = True

    def __init__(self) -> None:
        self.contrib = pytest.importorskip("retrysafe.contrib.rq")
        redis_url, self.run_id = _redis()
        import redis
        from rq import Queue, SimpleWorker

        self.redis = redis.Redis.from_url(redis_url)
        self.queue = Queue(f"contract-{self.run_id}", connection=self.redis)
        self.errors: dict[str, BaseException] = {}

        def failed(job: Any, exc_type: Any, exc: BaseException, tb: Any) -> bool:
            self.errors[job.id] = exc
            return True

        self.worker = SimpleWorker(
            [self.queue],
            connection=self.redis,
            name=f"contract-{self.run_id}",
            exception_handlers=[failed],
        )
        self.names: list[str] = []
        self.stores: list[Any] = []
        self.jobs = itertools.count()

    def define(self, body: Callable[..., Any], *, store: str, **options: Any) -> Any:
        keyed = self.contrib.idempotent_job(body, store=store, **options)
        self.stores.append(keyed.retrysafe.store)
        name = f"_rq_job_{self.run_id.replace('-', '_')}_{len(self.names)}"
        globals()[name] = keyed
        self.names.append(name)
        return f"{__name__}.{name}"

    def send(self, handle: Any, key: str, *args: Any) -> Sent:
        job = self.queue.enqueue(
            handle,
            *args,
            job_id=f"{self.run_id}-{next(self.jobs)}",
            **self.contrib.idempotency_key(key),
        )
        with warnings.catch_warnings():
            # RQ's own worker class and a job without Retry are warned about, once per process
            warnings.simplefilter("ignore", RuntimeWarning)
            self.worker.work(burst=True)
        error = self.errors.pop(job.id, None)
        if error is not None:
            return Sent(error=error)
        return Sent(job.return_value())

    def close(self) -> None:
        for name in self.names:
            globals().pop(name, None)
        for store in self.stores:
            store.close()
        for key in self.redis.scan_iter(match=f"*{self.run_id}*", count=1000):
            self.redis.unlink(key)
        self.redis.close()


class ArqFront:
    """``@idempotent_job`` over an ``async def job(ctx, ...)`` with ``body``'s parameters, run
    by an arq ``Worker`` in this process (a burst per delivery) on the real Redis; the key as
    ``idempotency_key=``; the caller's ``job.result()`` (arq hands back the job's exception)."""

    id = "arq"
    returns_results = True

    def __init__(self) -> None:
        self.contrib = pytest.importorskip("retrysafe.contrib.arq")
        redis_url, self.run_id = _redis()
        from arq import create_pool
        from arq.connections import RedisSettings

        self.queue = f"contract-{self.run_id}"
        self.loop = asyncio.new_event_loop()
        self.pool = self.loop.run_until_complete(
            create_pool(RedisSettings.from_dsn(redis_url), default_queue_name=self.queue)
        )
        self.functions: list[Any] = []
        self.stores: list[Any] = []
        self.jobs = itertools.count()

    def define(self, body: Callable[..., Any], *, store: str, **options: Any) -> Any:
        import inspect

        from arq.worker import func

        @functools.wraps(body)
        async def target(ctx: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            return body(*args, **kwargs)

        signature = inspect.signature(body)
        ctx = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        target.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[ctx, *signature.parameters.values()]
        )
        keyed = self.contrib.idempotent_job(target, store=store, **options)
        self.stores.append(keyed.retrysafe.store)
        name = f"contract_{len(self.functions)}"
        self.functions.append(func(keyed, name=name, max_tries=1))
        return name

    def send(self, handle: Any, key: str, *args: Any) -> Sent:
        from arq.worker import Worker

        async def run() -> Any:
            job = await self.pool.enqueue_job(
                handle, *args, idempotency_key=key, _job_id=f"{self.run_id}-{next(self.jobs)}"
            )
            assert job is not None
            worker = Worker(
                functions=self.functions,
                redis_pool=self.pool,
                queue_name=self.queue,
                burst=True,
                poll_delay=0.05,
                handle_signals=False,
            )
            await worker.main()
            return await job.result(timeout=30, poll_delay=0.05)

        try:
            return Sent(self.loop.run_until_complete(run()))
        except Exception as error:
            return Sent(error=error)

    def close(self) -> None:
        async def end() -> None:
            for store in self.stores:
                await store.aclose()
            async for key in self.pool.scan_iter(match=f"*{self.run_id}*", count=1000):
                await self.pool.unlink(key)
            await self.pool.aclose()

        self.loop.run_until_complete(end())
        self.loop.close()


FRONTS = [
    pytest.param(DefFront, id="def"),
    pytest.param(AsyncDefFront, id="async-def"),
    pytest.param(ConsumerFront, id="consumer"),
    pytest.param(CeleryFront, id="celery"),
    pytest.param(DramatiqFront, id="dramatiq"),
    pytest.param(HueyFront, id="huey"),
    pytest.param(TaskiqFront, id="taskiq"),
    pytest.param(RQFront, id="rq"),
    pytest.param(ArqFront, id="arq"),
]

__all__ = ["FRONTS", "CallFront", "Sent"]
