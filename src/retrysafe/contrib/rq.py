"""RQ jobs whose effect happens once per business key, across duplicate enqueues, retries and
killed work-horses: a job function decorator and a worker class::

    from redis import Redis
    from rq import Queue, Retry
    from retrysafe.contrib.rq import idempotency_key, idempotent_job

    @idempotent_job(store="postgresql://localhost/shop")      # or key="order_id"
    def charge(order_id: str, amount: int) -> dict:
        ...

    queue = Queue(connection=Redis())
    queue.enqueue(charge, "o-1", 100, retry=Retry(max=3), **idempotency_key("o-1"))

    # rq worker -w retrysafe.contrib.rq.Worker --maintenance-interval 5 --job-monitoring-interval 2

The key is, in this order: the business key in the job's ``meta`` (:func:`idempotency_key`), an
``idempotency_key=`` keyword argument, the decorator's ``key=`` (a parameter name or a callable
over the arguments), else the job's id (the same for every retry of one job, so a retried job
never runs twice; only a business key also catches a producer that enqueues twice).

Each job: the first runs the function and stores its result (its lease renewed while it runs);
a job whose key is complete returns the stored result without running (its caller's
``job.return_value()`` is the first run's); one that finds a live worker running the key waits
in its work-horse, looking again every few seconds, until the first run's result answers it, or
its owner is found dead and it takes the key over and runs (the job is never failed, and no
retry is spent). Inside the job :func:`retrysafe.functions.transaction` and
:func:`retrysafe.functions.mark_committed` work as in any idempotent function.

RQ runs a killed work-horse's job again only when the job was enqueued with ``retry=Retry(...)``,
and only once another worker's maintenance finds its heartbeat expired (RQ's worker: the job
monitoring interval + 60 s, then up to ``--maintenance-interval``, 600 s by default; an idle
worker runs its maintenance only after waiting up to 405 s for a job). :class:`Worker` gives a
dead worker's job back after the monitoring interval + 10 s, idle or not (a live job found late
is safe: its copy waits), and checks at start and on each job what would lose a job
or run it twice (a ``RuntimeWarning`` and a log line).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, Unpack, overload

from .._core.config import IdempotencyConfig
from ..calls import (
    KEY_HEADER,
    FunctionOptions,
    deliver_waiting,
    message_key,
    task_function,
    warn_once,
)
from ..stores import Store
from ._extra import extra

with extra("rq"):
    import rq.worker
    from rq import get_current_job
    from rq.job import Job

__all__ = ["Worker", "check_job", "check_worker", "idempotency_key", "idempotent_job"]

P = ParamSpec("P")
R = TypeVar("R")

#: Seconds a killed worker's job waits before it is given back, past the monitoring interval.
HEARTBEAT_GRACE = 10

#: A maintenance interval past this many seconds leaves a killed worker's job waiting long.
SLOW_MAINTENANCE = 60


def idempotency_key(key: str | int) -> dict[str, Any]:
    """The ``enqueue`` options that carry a business key in the job's ``meta``.

    ``queue.enqueue(charge, "o-1", 100, **idempotency_key("order-1"))`` (merge it into your own
    ``meta=`` if you pass one). Every job with the key has one effect.

    Raises:
        InvalidKeyError: the key is empty, longer than 255 characters, or not a ``str`` or
            ``int``: the enqueue fails, rather than the job in the worker.
    """
    return {"meta": {KEY_HEADER: message_key(key)}}


@overload
def idempotent_job(
    function: Callable[P, R], /, *, store: str | Store, **options: Unpack[FunctionOptions]
) -> Callable[P, R]: ...


@overload
def idempotent_job(
    function: None = None, /, *, store: str | Store, **options: Unpack[FunctionOptions]
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def idempotent_job(
    function: Callable[P, R] | None = None,
    /,
    *,
    store: str | Store,
    **options: Unpack[FunctionOptions],
) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """Make an RQ job function run once per key (put it under RQ's ``@job`` if you use it).

    Args:
        function: the job's ``def`` function (when used without options).
        store: a store URL or a synchronous store: every worker must share it.
        **options: :class:`~retrysafe.calls.FunctionOptions`, as
            :func:`~retrysafe.idempotent_function` takes them: ``key`` (a parameter name,
            several, or a callable over the arguments; a key in the job's ``meta`` or an
            ``idempotency_key=`` argument wins; without any, the job's id is the key),
            ``name`` (default: the function's module and qualified name), ``fingerprint``,
            ``codec``, ``final``, ``config`` or the call options (``ttl``: longer than any
            retry; ``lease``, ``on_store_error``, ``transactional``, ``on_event``).

    Raises:
        ConfigurationError: a bad option, named (at import, in producers and workers alike).
    """

    def decorate(target: Callable[P, R]) -> Callable[P, R]:
        where = f"idempotent_job({getattr(target, '__qualname__', target)})"
        keyed = task_function(target, store, options, where=where)

        @functools.wraps(target)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            job = get_current_job()
            if job is None:  # called directly, not by a worker
                return keyed(*args, **kwargs)  # type: ignore[no-any-return]
            warn_once(check_job(job, keyed.config, _worker))
            header = (job.meta or {}).get(KEY_HEADER)
            return deliver_waiting(keyed, args, kwargs, key=header, fallback=job.id)  # type: ignore[no-any-return]

        run.retrysafe = keyed  # type: ignore[attr-defined]
        return run

    return decorate if function is None else decorate(function)


# -- the worker and its checks ----------------------------------------------------------------

#: The worker running this process's jobs (set in the work-horse by :class:`Worker`).
_worker: rq.worker.Worker | None = None


def _recovery(worker: rq.worker.Worker) -> float:
    """Seconds after a worker's death within which its job is given back, at the most."""
    grace = HEARTBEAT_GRACE if isinstance(worker, Worker) else 60
    return float(worker.job_monitoring_interval + grace + worker.maintenance_interval)


def check_worker(worker: rq.worker.Worker) -> list[str]:
    """What in ``worker``'s settings leaves a killed worker's job waiting long (run by
    :class:`Worker` at start; call it for RQ's own worker classes)."""
    out: list[str] = []
    if worker.maintenance_interval > SLOW_MAINTENANCE:
        out.append(
            f"RQ worker {worker.name}: maintenance runs every {worker.maintenance_interval:g} s, "
            f"so a killed worker's job is run again only up to {_recovery(worker):g} s after "
            "the kill; pass --maintenance-interval 5 (maintenance_interval=5)"
        )
    if not isinstance(worker, Worker):
        out.append(
            f"RQ worker {worker.name}: RQ's own worker class gives a killed worker's job back "
            "60 s after its last heartbeat at the earliest; use retrysafe.contrib.rq.Worker "
            "(-w retrysafe.contrib.rq.Worker) to have it back in seconds"
        )
    return out


def check_job(
    job: Job, config: IdempotencyConfig, worker: rq.worker.Worker | None = None
) -> list[str]:
    """What in ``job``'s options would lose it when its worker is killed, or run it twice."""
    out: list[str] = []
    where = f"RQ job {job.func_name}"
    if job.retries_left is None:
        out.append(
            f"{where}: enqueued without retry=Retry(max=...), so a job whose worker is killed "
            "is marked failed (AbandonedJobError), not run again; enqueue it with "
            "retry=Retry(max=3) (retrysafe runs the retried job once, taking the dead "
            "worker's key over)"
        )
    if worker is not None and config.ttl <= _recovery(worker):
        out.append(
            f"{where}: its ttl ({config.ttl:g} s) is not longer than the time a killed "
            f"worker's job may wait before RQ runs it again ({_recovery(worker):g} s): such a "
            "job would run again; set ttl well above it"
        )
    return out


class Worker(rq.worker.Worker):
    """RQ's forking worker that gives a killed worker's job back in seconds, not minutes.

    A job's execution is taken as dead ``job_monitoring_interval`` + 10 s after its last
    heartbeat (RQ's own: + 60 s); a live job found late by a busy machine is run again as a
    copy, which waits for the first run's result and never runs. An idle worker wakes every
    maintenance interval to run its maintenance (RQ's own waits up to 405 s for a job first, so
    a job killed when no more jobs come in waits that long). Use it with
    ``--maintenance-interval 5`` (how often the started jobs are looked at) and jobs enqueued
    with ``retry=Retry(max=...)``; the worker warns at start otherwise.
    """

    @property
    def dequeue_timeout(self) -> int:
        """Seconds an idle worker blocks waiting for a job: at most the maintenance interval
        (RQ's own: ``worker_ttl`` - 15, 405 s), since an idle worker runs its maintenance, which
        gives a killed worker's job back, only between two waits."""
        own = int(super().dequeue_timeout)
        return max(1, min(own, int(self.maintenance_interval)))

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        """Seconds an execution lives without a heartbeat."""
        interval = float(self.job_monitoring_interval)
        if job.timeout and job.timeout > 0:
            interval = max(1.0, min(job.timeout - working_time, interval))
        return int(interval) + HEARTBEAT_GRACE

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        """RQ's start, then the check of this worker's settings."""
        super().bootstrap(*args, **kwargs)
        warn_once(check_worker(self))

    def perform_job(self, job: Job, queue: Any, execution: Any) -> bool:
        """Run a job in the work-horse (which knows its worker, for the job's checks)."""
        global _worker
        _worker = self
        return bool(super().perform_job(job, queue, execution))
