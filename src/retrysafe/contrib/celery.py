"""Celery tasks whose effect happens once per business key, across redeliveries, producer
retries, visibility timeouts and killed workers::

    from celery import Celery
    from retrysafe.contrib.celery import idempotency_key, idempotent_task

    app = Celery("shop", broker="redis://localhost:6379/0")

    @app.task(acks_late=True, reject_on_worker_lost=True)
    @idempotent_task(store="postgresql://localhost/shop")
    def charge(order_id: str, amount: int) -> dict:
        ...

    charge.apply_async(("o-1", 100), **idempotency_key("o-1"))   # or: key="order_id" above

The key is, in this order: the business key the producer put in the message's headers
(:func:`idempotency_key`), an ``idempotency_key=`` keyword argument (what ``delay`` and
``delay_on_commit`` can carry), the decorator's ``key=`` (a parameter name or a callable over the
arguments), else the task's id (the same for every redelivery of one message, so a redelivery
never runs twice; only a business key also catches a producer that sends twice).

Each delivery: the first runs the task and stores its result (its lease renewed while it runs);
a delivery whose key is complete returns the stored result without running; one that finds a
live worker running the key is sent again after a few seconds (a retry that does not count
against ``max_retries``), never run and never dropped; one that finds a dead worker's key takes
it over and runs it, or, when that worker had called :func:`~retrysafe.functions.mark_committed`,
fails with :class:`~retrysafe.OutcomeUnknownError` for an operator. When the store fails
(``on_store_error="fail_closed"``, the default) the delivery is sent again two seconds later
the same way: a failed task would be acknowledged and lost.
Inside the task :func:`retrysafe.functions.transaction` and
:func:`retrysafe.functions.mark_committed` work as in any idempotent function
(``transactional=True`` with a SQL store or ``store="django"``: the task's writes commit with its
record).

At worker start (``worker_init``) the broker's ``visibility_timeout``, the tasks' time limits,
``acks_late`` and ``task_reject_on_worker_lost`` are checked against each idempotent task's lease
and TTL; what would bring a copy back while the task runs, or lose it, is a ``RuntimeWarning``
and a log line.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, Unpack, overload

from ..calls import (
    KEY_HEADER,
    FunctionOptions,
    IdempotentFunction,
    Redelivery,
    message_key,
    redelivery_warnings,
    task_function,
    warn_once,
)
from ..stores import Store
from ._extra import extra

with extra("celery"):
    from celery import Celery, signals
    from celery._state import get_current_task
    from celery.exceptions import Reject, Retry

__all__ = ["check_worker", "idempotency_key", "idempotent_task"]

P = ParamSpec("P")
R = TypeVar("R")

#: Brokers that deliver an unacknowledged message again after ``visibility_timeout`` (kombu's
#: default for them: one hour).
_VISIBILITY_BROKERS = {"redis": 3600.0, "rediss": 3600.0, "sqs": 1800.0}


def idempotency_key(key: str | int) -> dict[str, Any]:
    """The ``apply_async`` options that carry a business key in the message's headers.

    ``task.apply_async(args, **idempotency_key("order-1"))`` (also with
    ``apply_async_on_commit``). ``delay`` takes no options: pass ``idempotency_key=...`` as a
    keyword argument instead (the decorated task takes it off before the function is called).

    Args:
        key: the business key (1-255 characters): every message with it has one effect.

    Raises:
        InvalidKeyError: the key is empty, longer than 255 characters, or not a ``str`` or
            ``int``: the send fails, rather than the task in the worker (where ``acks_late``
            would acknowledge the failed message and it would never run).
    """
    return {"headers": {KEY_HEADER: message_key(key)}}


@overload
def idempotent_task(
    function: Callable[P, R], /, *, store: str | Store, **options: Unpack[FunctionOptions]
) -> Callable[P, R]: ...


@overload
def idempotent_task(
    function: None = None, /, *, store: str | Store, **options: Unpack[FunctionOptions]
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def idempotent_task(
    function: Callable[P, R] | None = None,
    /,
    *,
    store: str | Store,
    **options: Unpack[FunctionOptions],
) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """Make a Celery task's function run once per key; put it under ``@app.task`` or
    ``@shared_task`` (with ``bind=True`` too: ``self`` is left out of the fingerprint).

    Args:
        function: the task's function (when used without options).
        store: a store URL (``"postgresql://..."``, ``"redis://..."``, ``"sqlite:///..."``,
            ``"django"``) or a synchronous store: every worker must share it.
        **options: :class:`~retrysafe.calls.FunctionOptions`, as
            :func:`~retrysafe.idempotent_function` takes them: ``key`` (a parameter name,
            several, or a callable over the arguments; a key in the message's headers or an
            ``idempotency_key=`` argument wins; without any, the task's id is the key),
            ``name`` (default: the function's module and qualified name), ``fingerprint`` (a
            key sent again with other values fails with :class:`~retrysafe.KeyReusedError`),
            ``codec``, ``final``, ``config`` or the call options (``ttl``: how long a key is
            remembered, longer than any redelivery; ``lease``, ``on_store_error``,
            ``transactional``, ``on_event``).

    Returns:
        The function to register as the task (or, without ``function``, the decorator).

    Raises:
        ConfigurationError: a bad option, named (at import, in producers and workers alike).
    """

    def decorate(target: Callable[P, R]) -> Callable[P, R]:
        where = f"idempotent_task({getattr(target, '__qualname__', target)})"
        keyed = task_function(target, store, options, where=where)

        @functools.wraps(target)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            task = get_current_task()
            request = None if task is None else task.request
            if request is None or request.called_directly:
                return keyed(*args, **kwargs)  # type: ignore[no-any-return]
            header = _header_key(request)
            delivery = keyed.deliver(args, kwargs, key=header, fallback=request.id, queue=True)
            if delivery.dead_letter and delivery.error is not None:
                raise delivery.error  # the task fails, for a person to look at
            if not delivery.retry:
                return delivery.result  # type: ignore[no-any-return]
            _retry_later(task, request, delivery.retry_after or 1, header)
            raise AssertionError("unreachable")  # pragma: no cover

        run.retrysafe = keyed  # type: ignore[attr-defined]
        _connect_checks()
        return run

    return decorate if function is None else decorate(function)


def _header_key(request: Any) -> object:
    # Celery keeps a message's custom headers both as request attributes and in
    # ``request.headers`` (which one depends on the protocol version and on retries).
    key = getattr(request, KEY_HEADER, None)
    if key is None:
        key = (getattr(request, "headers", None) or {}).get(KEY_HEADER)
    return key


def _retry_later(task: Any, request: Any, countdown: int, header: object) -> None:
    """Send the task again in ``countdown`` seconds (same id, arguments and key) and end this
    delivery as retried: what ``self.retry(countdown=...)`` does, without counting against the
    task's ``max_retries`` (waiting for another worker, or for the store to come back, is not a
    failure of this task)."""
    options: dict[str, Any] = {"countdown": countdown, "retries": request.retries}
    if header is not None:
        options["headers"] = {**(request.headers or {}), KEY_HEADER: header}
    again = task.signature_from_request(request, **options)
    try:
        again.apply_async()
    except Exception as exc:  # not sent: give the message back to the broker, never drop it
        raise Reject(exc, requeue=True) from exc
    raise Retry(when=countdown, sig=again)


# -- the worker-start check -------------------------------------------------------------------

_connected = False


def _connect_checks() -> None:
    global _connected
    if not _connected:
        signals.worker_init.connect(_on_worker_init, weak=False)
        _connected = True


def _on_worker_init(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is not None:
        warn_once(check_worker(app))


def check_worker(app: Celery) -> list[str]:
    """What in ``app``'s configuration would bring an idempotent task back while it still runs,
    or lose it (run by every worker at start, ``worker_init``; call it in your own checks).

    Returns:
        One sentence per task and problem (empty: nothing to say).
    """
    conf = app.conf
    url = str(conf.broker_url or "amqp://")
    scheme = url.split("://", 1)[0].split("+", 1)[0].lower()
    vt: float | None = None
    if scheme in _VISIBILITY_BROKERS:
        options = conf.broker_transport_options or {}
        vt = float(options.get("visibility_timeout", _VISIBILITY_BROKERS[scheme]))
    out: list[str] = []
    for task in list(app.tasks.values()):
        keyed = getattr(getattr(task, "run", None), "retrysafe", None)
        if not isinstance(keyed, IdempotentFunction):
            continue
        acks_late = bool(getattr(task, "acks_late", conf.task_acks_late))
        reject = getattr(task, "reject_on_worker_lost", None)
        if reject is None:
            reject = bool(conf.task_reject_on_worker_lost)
        limit = getattr(task, "time_limit", None) or conf.task_time_limit
        rules = Redelivery("Celery", scheme, vt, acks_late, bool(reject))
        out += redelivery_warnings(rules, task.name, keyed.config, limit)
    return out
