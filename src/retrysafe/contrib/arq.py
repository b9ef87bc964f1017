"""arq jobs whose effect happens once per business key, across duplicate enqueues and the re-runs
of a killed worker's jobs: a job function decorator and a check of the worker's settings::

    from arq.connections import RedisSettings
    from retrysafe.contrib.arq import check_at_startup, idempotent_job

    @idempotent_job(store="postgresql://localhost/shop", key="order_id")
    async def charge(ctx, order_id: str, amount: int) -> dict:
        ...

    @check_at_startup
    class WorkerSettings:
        functions = [charge]
        redis_settings = RedisSettings()
        job_timeout = 60            # a killed worker's job runs again 70 s later

    await redis.enqueue_job("charge", "o-1", 100, idempotency_key="o-1")

The key is, in this order: an ``idempotency_key=`` keyword argument of the job, the decorator's
``key=`` (a parameter name or a callable over the arguments; ``ctx`` is never one), else the
job's id (``_job_id=`` or arq's own: the same for every re-run of one job). The job's ``ctx`` is
passed through and left out of the fingerprint.

Each job: the first runs the function and stores its result (its lease renewed while it runs);
a job whose key is complete returns the stored result without running (arq keeps it as that
job's result, so every caller's ``job.result()`` is the first run's); one that finds a live
worker running the key waits (``asyncio.sleep``, a few seconds at a time: no try is spent)
until the first run's result answers it or its owner is found dead and it takes the key over.
arq runs a killed worker's job again once its in-progress key expires (the longest job timeout
+ 10 s), as another try: :func:`check_at_startup` warns where ``max_tries`` would fail that try
or the record's ``ttl`` is too short to answer it.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, Unpack, overload

from ..calls import (
    FunctionOptions,
    IdempotentFunction,
    adeliver_waiting,
    task_function,
    warn_once,
)
from ..stores import AsyncStore, Store
from ._extra import extra

with extra("arq"):
    from arq.worker import Function

__all__ = ["check_at_startup", "check_worker", "idempotent_job"]

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
S = TypeVar("S")

#: arq's defaults (``arq.worker.Worker``).
_JOB_TIMEOUT = 300.0
_MAX_TRIES = 5

_ctx: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("retrysafe_arq_ctx")


@overload
def idempotent_job(
    function: F, /, *, store: str | AsyncStore | Store, **options: Unpack[FunctionOptions]
) -> F: ...


@overload
def idempotent_job(
    function: None = None,
    /,
    *,
    store: str | AsyncStore | Store,
    **options: Unpack[FunctionOptions],
) -> Callable[[F], F]: ...


def idempotent_job(
    function: F | None = None,
    /,
    *,
    store: str | AsyncStore | Store,
    **options: Unpack[FunctionOptions],
) -> F | Callable[[F], F]:
    """Make an arq job function (``async def job(ctx, ...)``) run once per key.

    Args:
        function: the job's ``async def`` function, ``ctx`` first (when used without options).
        store: a store URL or store: every worker must share it.
        **options: :class:`~retrysafe.calls.FunctionOptions`, as
            :func:`~retrysafe.idempotent_function` takes them: ``key`` (the key from the
            arguments after ``ctx``: a parameter name, several, or a callable over them; an
            ``idempotency_key=`` argument wins; without any, the job's id), ``name`` (default:
            the function's module and qualified name), ``fingerprint`` (default: all but
            ``ctx``), ``codec``, ``final``, ``config`` or the call options (``ttl``: longer
            than a re-run's delay; ``lease``, ``on_store_error``, ``transactional``,
            ``on_event``).

    Raises:
        ConfigurationError: a bad option, named (at import).
    """

    def decorate(target: F) -> F:
        where = f"idempotent_job({getattr(target, '__qualname__', target)})"
        keyed = task_function(_without_ctx(target), store, options, where=where, is_async=True)

        @functools.wraps(target)
        async def run(ctx: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            token = _ctx.set(ctx)
            try:
                return await adeliver_waiting(keyed, args, kwargs, fallback=ctx["job_id"])
            finally:
                _ctx.reset(token)

        run.retrysafe = keyed  # type: ignore[attr-defined]
        return run  # type: ignore[return-value]

    return decorate if function is None else decorate(function)


def _without_ctx(target: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """The job's function with its ``ctx`` taken from the running job: what is keyed and
    fingerprinted are the other arguments."""

    @functools.wraps(target)
    async def body(*args: Any, **kwargs: Any) -> Any:
        return await target(_ctx.get(), *args, **kwargs)

    signature = inspect.signature(target)
    body.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=list(signature.parameters.values())[1:]
    )
    return body


def check_worker(settings: Any) -> list[str]:
    """What in arq worker ``settings`` (a ``WorkerSettings`` class or the ``Worker``'s keyword
    arguments) loses an idempotent job whose worker is killed, or runs it twice."""
    get = settings.get if isinstance(settings, dict) else functools.partial(getattr, settings)
    job_timeout = float(get("job_timeout", _JOB_TIMEOUT) or _JOB_TIMEOUT)
    max_tries = int(get("max_tries", _MAX_TRIES) or _MAX_TRIES)
    jobs = [
        (f.coroutine, f.max_tries, f.timeout_s) if isinstance(f, Function) else (f, None, None)
        for f in get("functions", ())
    ]
    # arq runs a dead worker's job again when its in-progress key expires: the longest timeout
    # + 10 s after the job started
    delay = max([job_timeout, *(t for _, _, t in jobs if t)]) + 10
    out: list[str] = []
    for coroutine, own_tries, _ in jobs:
        keyed = getattr(coroutine, "retrysafe", None)
        if not isinstance(keyed, IdempotentFunction):
            continue
        where = f"arq job {getattr(coroutine, '__qualname__', coroutine)}"
        tries = own_tries or max_tries
        if tries < 2:
            out.append(
                f"{where}: max_tries is {tries}, so a job whose worker is killed is not run "
                "again (arq fails it: max retries exceeded); allow max_tries=3 or more "
                "(retrysafe runs the re-run once, taking the dead worker's key over)"
            )
        if keyed.config.ttl <= delay:
            out.append(
                f"{where}: its ttl ({keyed.config.ttl:g} s) is not longer than the time after "
                f"which arq runs a killed worker's job again ({delay:g} s: the longest "
                "job_timeout + 10 s): such a job would run again; set ttl well above it"
            )
    return out


def check_at_startup(settings: S) -> S:
    """Check ``settings`` (a ``WorkerSettings`` class) when a worker starts: its ``on_startup``
    warns (a ``RuntimeWarning`` and a log line) with :func:`check_worker`'s findings, then runs
    the settings' own ``on_startup``, if any."""
    get = settings.get if isinstance(settings, dict) else functools.partial(getattr, settings)
    own = get("on_startup", None)

    async def on_startup(ctx: dict[str, Any]) -> None:
        warn_once(check_worker(settings))
        if own is not None:
            await own(ctx)

    if isinstance(settings, dict):
        settings["on_startup"] = on_startup
    else:
        settings.on_startup = on_startup  # type: ignore[attr-defined]
    return settings
