# Generated from src/retrysafe/_async/runner.py by scripts/unasync.py: do not edit.
"""The sync runner: performs the request flow's actions against a sync store.

The flow (:mod:`retrysafe._core.flow`) decides; this module only does what it is told: one store
call per action, the request's transaction object, the handler's finalizers, lease renewal and
background completion (through :class:`LeaseKeeper`). It is also the handler's context
(``transaction()``, ``mark_committed()``).

This file is generated from ``_async/runner.py`` by ``scripts/unasync.py``
(``make test`` checks that it is up to date): edit that file, then run the script.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .._core.drive_sync import drive
from .._core.flow import (
    BEGIN,
    CLOCK,
    COMPLETE,
    DEFER,
    EMIT,
    FINALIZE,
    MARK_COMMITTED,
    NOW,
    RELEASE,
    RENEW,
    RESERVE,
    SLEEP,
    TX_CLOSE,
    TX_COMPLETE,
    TX_ROLLBACK,
    TX_STATE,
    Action,
    Answer,
    Estimates,
    Flow,
    notify,
)
from .._core.transaction import Transaction
from ..stores._base import Store
from ._keeper import LeaseKeeper

__all__ = ["Exchange", "Runner"]


class Runner:
    """What one middleware's requests share: the store and the lease keeper.

    Args:
        store: the store.
    """

    __slots__ = ("estimates", "keeper", "store")

    def __init__(self, store: Store) -> None:
        self.store = store
        self.keeper = LeaseKeeper()
        self.estimates = Estimates()


class Exchange:
    """One keyed request: drives its :class:`~retrysafe._core.flow.Flow`, and is the handler's
    context (the object :func:`retrysafe.transaction` and :func:`retrysafe.mark_committed`
    find in the request's scope or environ).

    Args:
        runner: the middleware's runner.
        flow: the request's flow.
    """

    __slots__ = ("finalizers", "flow", "keeper", "started", "store", "tx")

    def __init__(self, runner: Runner, flow: Flow) -> None:
        self.flow = flow
        flow.estimates = runner.estimates  # the middleware's, shared by its requests
        self.started = 0.0
        self.store = runner.store
        self.keeper = runner.keeper
        self.tx: Transaction | None = None
        self.finalizers: list[Callable[[bool], None]] = []

    # -- what a shell calls, in order --------------------------------------------------------

    def claim(self) -> str | Answer:
        """See :meth:`Flow.claim` (the drive itself: no wrapper coroutine on the hot path)."""
        return drive(self.flow.claim(), self)

    def start(self) -> None:
        """The handler starts: renew its lease until it settles."""
        self.started = self.keeper.add(self, self.flow.config.lease / 3)

    def settle(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...],
        body: bytes,
        omitted: bool,
    ) -> Answer | None:
        """See :meth:`Flow.settle` (outside transactional mode its plain twin, whose verdict is
        always ``None``; no wrapper coroutine on the hot path)."""
        flow = self.flow
        flow.observe(self.keeper.discard(self) - self.started)
        if not flow.in_tx:
            return drive(flow.settle_plain(status, headers, body, omitted), self)
        return drive(flow.settle(status, headers, body, omitted), self)

    def fail(self, error: BaseException, started: bool) -> Answer | None:
        """See :meth:`Flow.failed`."""
        self.keeper.discard(self)
        return drive(self.flow.failed(error, started), self)

    def incomplete(self) -> None:
        """See :meth:`Flow.incomplete`."""
        self.keeper.discard(self)
        drive(self.flow.incomplete(), self)

    def end(self) -> None:
        """The request is over (whatever happened): close what is still open."""
        steps = self.flow.finish()
        if steps is not None:
            drive(steps, self)

    # -- the handler's context ---------------------------------------------------------------

    @property
    def transaction(self) -> Transaction | None:
        """The request's transaction in transactional mode, else ``None``."""
        return self.tx

    def add_finalizer(self, finalizer: Callable[[bool], None]) -> None:
        """Run ``finalizer(ok)`` before the transaction ends (``ok``: it is about to commit),
        e.g. to flush and close an ORM session opened on it."""
        self.finalizers.append(finalizer)

    def mark_committed(self) -> bool:
        """See :func:`retrysafe.mark_committed`."""
        return drive(self.flow.mark_committed(), self)

    # -- beside the handler ------------------------------------------------------------------

    def renew(self) -> bool:
        """Renew the lease (the keeper calls this); ``False``: stop renewing."""
        return drive(self.flow.renew(), self)

    def _complete_later(self, data: bytes) -> None:
        try:
            drive(self.flow.complete_later(data), self)
        finally:
            self.keeper.discard(self)

    # -- performing actions ------------------------------------------------------------------

    def perform(self, action: Action) -> Any:
        """Carry out one action of the flow (for :func:`drive`). The two actions of every keyed
        request hand back the store's own call."""
        op, arg = action
        if op is RESERVE:
            flow = self.flow
            config = flow.config
            return self.store.reserve(
                flow.record_id, flow.fingerprint, lease=config.lease, ttl=config.ttl
            )
        if op is COMPLETE:
            flow = self.flow
            return self.store.complete(flow.record_id, flow.token, arg, ttl=flow.config.ttl)
        return self._act(op, arg)

    def _act(self, op: str, arg: Any) -> Any:
        flow = self.flow
        token = flow.token  # "" before the key is won (only EMIT, CLOCK, SLEEP then)
        if op is RELEASE:
            return self.store.release(flow.record_id, token)
        if op is EMIT:
            if isinstance(arg, tuple):
                notify(flow.config, arg[0], flow.request, flow.record_id, arg[1])
            else:
                notify(flow.config, arg, flow.request, flow.record_id)
            return None
        if op is RENEW:
            return self.store.renew(flow.record_id, token, lease=flow.config.lease)
        if op is MARK_COMMITTED:
            return self.store.mark_committed(flow.record_id, token, lease=arg)
        if op is BEGIN:
            self.tx = self.store.begin()  # type: ignore[attr-defined]
            return None
        if op is TX_STATE:
            tx = self.tx
            return (False, False) if tx is None else (tx.begun, tx.broken)
        if op is TX_COMPLETE:
            assert self.tx is not None
            return self.tx.complete(flow.record_id, token, arg, ttl=flow.config.ttl)
        if op is TX_ROLLBACK:
            if self.tx is not None:
                self.tx.rollback()
            return None
        if op is TX_CLOSE:
            tx, self.tx = self.tx, None
            if tx is not None:
                tx.close()
            return None
        if op is FINALIZE:
            finalizers, self.finalizers = self.finalizers, []
            for finalizer in finalizers:
                finalizer(arg)
            return None
        if op is SLEEP:
            self.keeper.sleep(arg)
            return None
        if op is CLOCK:
            return self.keeper.clock()
        if op is NOW:
            return time.time()
        if op is DEFER:
            self.keeper.add(self, flow.config.lease / 3)  # the key stays ours while we retry
            self.keeper.spawn(self._complete_later, arg)
            return None
        raise AssertionError(f"unknown flow action {op!r}")  # pragma: no cover
