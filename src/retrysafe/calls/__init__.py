"""The calls wing: idempotent functions, message consumers and task queues on one core, as the
HTTP shells are (DESIGN section 6).

- the options every call front takes, declared once (:class:`CallOptions`,
  :class:`HandlerOptions`, :class:`FunctionOptions`: each front's signature unpacks one);
- the function decorator (:func:`idempotent_function`, :class:`IdempotentFunction`);
- the delivery outcome (:class:`Delivery`) and the one
  :meth:`IdempotentFunction.deliver` that every queue and the consumer run a message by;
- what the task queues' adapters share: :func:`task_function`, :func:`message_key`, the
  wait in the worker of the queues that do not send a copy back (:func:`deliver_waiting`,
  :func:`adeliver_waiting`), and the worker-start check of the queue's redelivery rules
  (:class:`Redelivery`, :func:`redelivery_warnings`);
- inside a ``def`` idempotent function: :func:`mark_committed` and :func:`transaction` (the
  synchronous twins of ``await retrysafe.mark_committed()`` / ``retrysafe.transaction()``).

Users import from :mod:`retrysafe`, :mod:`retrysafe.functions`, :mod:`retrysafe.consumer` and
:mod:`retrysafe.contrib.celery`, ``.dramatiq``, ``.rq``, ``.arq``, ``.huey``, ``.taskiq``; a
new queue's adapter imports from here.
"""

from __future__ import annotations

from .._core.transaction import sync_mark_committed as mark_committed
from .._core.transaction import sync_transaction as transaction
from ._delivery import (
    IN_PROGRESS_RETRY_MAX,
    STORE_RETRY_AFTER,
    Delivery,
    DeliveryOptions,
    Status,
    refused,
)
from ._function import IdempotentFunction, idempotent_function, make_function
from ._options import (
    CALL_OPTIONS,
    CallOptions,
    FunctionOptions,
    HandlerOptions,
    call_config,
)
from ._queues import (
    KEY_HEADER,
    WAIT_POLL,
    Redelivery,
    adeliver_waiting,
    deliver_waiting,
    message_key,
    redelivery_warnings,
    task_function,
    warn_once,
)

__all__ = [
    "CALL_OPTIONS",
    "IN_PROGRESS_RETRY_MAX",
    "KEY_HEADER",
    "STORE_RETRY_AFTER",
    "WAIT_POLL",
    "CallOptions",
    "Delivery",
    "DeliveryOptions",
    "FunctionOptions",
    "HandlerOptions",
    "IdempotentFunction",
    "Redelivery",
    "Status",
    "adeliver_waiting",
    "call_config",
    "deliver_waiting",
    "idempotent_function",
    "make_function",
    "mark_committed",
    "message_key",
    "redelivery_warnings",
    "refused",
    "task_function",
    "transaction",
    "warn_once",
]
