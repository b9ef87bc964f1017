"""What one delivery of a message (a consumer's, a task queue's) came to: :class:`Delivery`, and
the one mapping from a call's refusals to it (:func:`refused`), which every queue and the
consumer share through :meth:`~retrysafe.calls.IdempotentFunction.deliver`.

================================  ==========================  ================================
the call                          ``Delivery.status``         the broker is told
================================  ==========================  ================================
ran now / answered from the store ``executed`` / ``replayed``  ``ack``
a live owner runs the key         ``in_progress``              ``retry`` after ``retry_after``
the store failed (a queue only)   ``store_unavailable``        ``retry`` after ``retry_after``
key reused / outcome unknown      ``key_reused`` /             ``dead_letter`` (a task queue
                                  ``outcome_unknown``          fails the task: its dead letter)
================================  ==========================  ================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from .._core.errors import InProgressError, KeyReusedError, OutcomeUnknownError, StoreError

__all__ = [
    "IN_PROGRESS_RETRY_MAX",
    "REFUSALS",
    "STORE_RETRY_AFTER",
    "Delivery",
    "DeliveryOptions",
    "Status",
    "refused",
]

Status = Literal[
    "executed", "replayed", "in_progress", "store_unavailable", "key_reused", "outcome_unknown"
]

#: Seconds after which a task that met a failing store comes back.
STORE_RETRY_AFTER = 2

#: The longest a task that met a running copy waits before it comes back to look again.
IN_PROGRESS_RETRY_MAX = 5

#: The call errors that are a delivery's answer, not a failure of the handler.
REFUSALS = (InProgressError, KeyReusedError, OutcomeUnknownError, StoreError)


class DeliveryOptions(TypedDict, total=False):
    """Where one delivery's key comes from, and who delivers it again.

    Attributes:
        key: the message's key (a header, a message option): it wins over the arguments.
        fallback: the key when neither the message nor the arguments give one (a task's id:
            the same for every redelivery of one message).
        queue: the queue sends the message again itself (see :func:`refused`).
    """

    key: object
    fallback: object
    queue: bool


@dataclass(frozen=True, slots=True)
class Delivery:
    """What one delivery of a message came to, and what to tell the broker.

    Attributes:
        status: ``"executed"`` (the handler ran now), ``"replayed"`` (it ran before: the stored
            result), ``"in_progress"`` (another consumer is running it now),
            ``"store_unavailable"`` (the store failed, nothing ran or everything rolled back:
            the task shells' answer to a :class:`~retrysafe.StoreError`),
            ``"key_reused"`` (another message was handled with this key: a producer bug) or
            ``"outcome_unknown"`` (a consumer committed its effects and died before storing
            the result: an operator resolves it).
        result: the handler's result (``executed``, ``replayed``).
        retry_after: seconds after which a redelivery is likely to find the outcome
            (``in_progress``), or to find the store back (``store_unavailable``).
        error: the call's error behind a refusal (``key_reused``, ``outcome_unknown``,
            ``store_unavailable``, ``in_progress``), for a queue that fails the task with it.
    """

    status: Status
    result: Any = None
    retry_after: int | None = None
    error: BaseException | None = field(default=None, compare=False, repr=False)

    @property
    def ack(self) -> bool:
        """The message is handled: acknowledge it (delete it, commit its offset)."""
        return self.status in ("executed", "replayed")

    @property
    def retry(self) -> bool:
        """Another consumer runs it now, or the store failed: deliver it again later (after
        :attr:`retry_after`), never drop it."""
        return self.status in ("in_progress", "store_unavailable")

    @property
    def dead_letter(self) -> bool:
        """It can neither run nor be answered: set it aside for a person (dead-letter)."""
        return self.status in ("key_reused", "outcome_unknown")


def refused(error: Exception, *, queue: bool) -> Delivery:
    """The delivery a call's refusal comes to.

    Args:
        error: one of :data:`REFUSALS`.
        queue: the queue sends the message again itself (a task queue): a copy that met a
            running one looks again within :data:`IN_PROGRESS_RETRY_MAX` seconds (a queue polls
            cheaply; the error's ``retry_after`` is the HTTP answer's, up to a whole lease), and
            a store failure is an answer (``store_unavailable``: a failed task would be
            acknowledged and lost). For a hand-written consumer the store's error propagates.

    Raises:
        StoreError: ``error`` itself, when not ``queue``.
    """
    if isinstance(error, InProgressError):
        wait = error.retry_after
        if queue:
            wait = min(max(1, wait or 1), IN_PROGRESS_RETRY_MAX)
        return Delivery("in_progress", retry_after=wait, error=error)
    if isinstance(error, KeyReusedError):
        return Delivery("key_reused", error=error)
    if isinstance(error, OutcomeUnknownError):
        return Delivery("outcome_unknown", error=error)
    if queue and isinstance(error, StoreError):
        # Fail closed (the default): nothing ran unprotected, and a failure after the run is one
        # a retry may meet (writes rolled back with the record, or the key kept as outcome
        # unknown). The core has logged it (``store_error``).
        return Delivery("store_unavailable", retry_after=STORE_RETRY_AFTER, error=error)
    raise error
