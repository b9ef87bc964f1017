"""The async runner: performs a keyed operation's actions against an async store.

The operation (:mod:`retrysafe._core.operation`, with its HTTP and call layers) decides; this
module only does what it is told: one store call per action, the operation's transaction object,
the work's finalizers, lease renewal and background completion (through
:class:`AsyncLeaseKeeper`). It is also the work's context (``transaction()``,
``mark_committed()``). :class:`AsyncOperationRun` drives the phases every layer shares;
:class:`AsyncExchange` adds an HTTP request's, :class:`AsyncCallRun` a function call's.

The sync twin, ``_sync/runner.py``, is generated from this file by ``scripts/unasync.py``
(``make test`` checks that it is up to date): edit this file, then run the script.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from .._core.call import REPLAYED, Call
from .._core.codec import RawHeaders
from .._core.drive import drive
from .._core.errors import StoreError
from .._core.http import Answer, Flow
from .._core.operation import (
    BEGIN,
    CLOCK,
    COMPLETE,
    DEFER,
    EMIT,
    EXECUTE,
    FINALIZE,
    MARK_COMMITTED,
    NOW,
    RELEASE,
    RENEW,
    RESERVE,
    SLEEP,
    TX_CLOSE,
    TX_COMPLETE,
    TX_LOCKED,
    TX_ROLLBACK,
    TX_STATE,
    Action,
    Estimates,
    Operation,
)
from .._core.transaction import CURRENT_CALL, AsyncTransaction
from ..stores._base import AsyncStore
from ._keeper import AsyncLeaseKeeper

__all__ = ["AsyncCallRun", "AsyncExchange", "AsyncOperationRun", "AsyncRunner"]

V = TypeVar("V")
#: The operation's own class, so a layer's run sees its flow's methods (an attribute narrowed in
#: a subclass instead would keep the runners from compiling with mypyc).
F = TypeVar("F", bound="Operation[Any]")


class AsyncRunner:
    """What one front's operations share (a middleware's requests, a function's calls): the
    store, the lease keeper and the duration estimates.

    Args:
        store: the store.
        keeper: a lease keeper shared with other fronts (default: one of its own).
    """

    __slots__ = ("estimates", "keeper", "store")

    def __init__(self, store: AsyncStore, keeper: AsyncLeaseKeeper | None = None) -> None:
        self.store = store
        self.keeper = AsyncLeaseKeeper() if keeper is None else keeper
        self.estimates = Estimates()


class AsyncOperationRun(Generic[V, F]):
    """One keyed operation: drives the phases of its
    :class:`~retrysafe._core.operation.Operation` that every layer shares, and is the work's
    context (the object :func:`retrysafe.transaction` and :func:`retrysafe.mark_committed` find
    in the request's scope or environ, or in the current call).

    Args:
        runner: the front's runner.
        flow: the operation.
    """

    __slots__ = ("finalizers", "flow", "keeper", "started", "store", "tx")

    flow: F

    def __init__(self, runner: AsyncRunner, flow: F) -> None:
        self.flow = flow
        flow.estimates = runner.estimates  # the front's, shared by its operations
        self.started = 0.0
        self.store = runner.store
        self.keeper = runner.keeper
        self.tx: AsyncTransaction | None = None
        self.finalizers: list[Callable[[bool], Awaitable[None]]] | None = None  # made on first use

    # -- what a shell calls, in order --------------------------------------------------------

    async def claim(self) -> str | V:
        """See :meth:`Operation.claim`. The first reservation is made here, and its common
        verdicts come from :meth:`Operation.decided`: no generator, no drive on the hot path."""
        flow = self.flow
        config = flow.config
        try:
            reservation = await self.store.reserve(
                flow.record_id, flow.fingerprint, lease=config.lease, ttl=config.ttl
            )
        except BaseException as exc:  # the claim's policy decides (as drive throws it in)
            return await drive(flow.claim(exc), self)
        verdict = flow.decided(reservation)
        if verdict is None:
            return await drive(flow.claim(reservation), self)
        return verdict

    def start(self) -> None:
        """The work starts: renew its lease until it settles."""
        self.started = self.keeper.add(self, self.flow.config.lease / 3)

    async def end(self) -> None:
        """The operation is over (whatever happened): close what is still open."""
        steps = self.flow.finish()
        if steps is not None:
            await drive(steps, self)

    # -- the work's context ------------------------------------------------------------------

    @property
    def transaction(self) -> AsyncTransaction | None:
        """The operation's transaction in transactional mode, else ``None``."""
        return self.tx

    def add_finalizer(self, finalizer: Callable[[bool], Awaitable[None]]) -> None:
        """Run ``finalizer(ok)`` before the transaction ends (``ok``: it is about to commit),
        e.g. to flush and close an ORM session opened on it."""
        if self.finalizers is None:
            self.finalizers = []
        self.finalizers.append(finalizer)

    async def mark_committed(self) -> bool:
        """See :func:`retrysafe.mark_committed`."""
        return await drive(self.flow.mark_committed(), self)

    # -- beside the work ---------------------------------------------------------------------

    async def renew(self) -> bool:
        """Renew the lease (the keeper calls this); ``False``: stop renewing."""
        return await drive(self.flow.renew(), self)

    async def _complete_later(self, data: bytes) -> None:
        try:
            await drive(self.flow.complete_later(data), self)
        finally:
            self.keeper.discard(self)

    # -- performing actions ------------------------------------------------------------------

    def perform(self, action: Action) -> Awaitable[Any]:
        """Carry out one action of the operation (for :func:`drive`). The two actions of every
        keyed operation hand back the store's own call (no coroutine of ours per action on the hot
        path)."""
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

    async def _act(self, op: str, arg: Any) -> Any:
        flow = self.flow
        token = flow.token  # "" before the key is won (only EMIT, CLOCK, SLEEP then)
        if op is RELEASE:
            return await self.store.release(flow.record_id, token)
        if op is EMIT:
            if isinstance(arg, tuple):
                flow.notify(arg[0], arg[1])
            else:
                flow.notify(arg)
            return None
        if op is RENEW:
            return await self.store.renew(flow.record_id, token, lease=flow.config.lease)
        if op is MARK_COMMITTED:
            return await self.store.mark_committed(flow.record_id, token, lease=arg)
        if op is BEGIN:
            self.tx = self.store.begin()  # type: ignore[attr-defined]
            return None
        if op is TX_STATE:
            tx = self.tx
            return (False, False) if tx is None else (tx.begun, tx.broken)
        if op is TX_LOCKED:
            # An optional attribute: SQL stores with a single writer (SQLite) have it.
            return bool(getattr(self.tx, "holds_write_lock", False))
        if op is TX_COMPLETE:
            assert self.tx is not None
            return await self.tx.complete(flow.record_id, token, arg, ttl=flow.config.ttl)
        if op is TX_ROLLBACK:
            if self.tx is not None:
                await self.tx.rollback()
            return None
        if op is TX_CLOSE:
            tx, self.tx = self.tx, None
            if tx is not None:
                await tx.close()
            return None
        if op is FINALIZE:
            finalizers, self.finalizers = self.finalizers, None
            for finalizer in finalizers or ():
                await finalizer(arg)
            return None
        if op is SLEEP:
            await self.keeper.sleep(arg)
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


class AsyncExchange(AsyncOperationRun[Answer, Flow]):
    """One keyed HTTP request: the phases of its :class:`~retrysafe._core.http.Flow` that
    belong to HTTP (the response's settlement, a failing or unfinished handler).

    Args:
        runner: the middleware's runner.
        flow: the request's flow.
    """

    __slots__ = ()

    async def settle(
        self, status: int, headers: RawHeaders, body: bytes, omitted: bool
    ) -> Answer | None:
        """See :meth:`Flow.settle`. Outside transactional mode (its verdict is then always
        ``None``) the response is stored here: no generator, no drive when the store answers
        ``True`` (the hot path); :meth:`Operation.completed` takes any other answer."""
        flow = self.flow
        flow.observe(self.keeper.discard(self) - self.started)
        if flow.in_tx:
            return await drive(flow.settle(status, headers, body, omitted), self)
        data = flow.stored(status, headers, body, omitted)
        if data is None:
            await drive(flow.settle_data(None), self)
            return None
        flow.settling = True
        try:
            done: object = await self.store.complete(
                flow.record_id, flow.token, data, ttl=flow.config.ttl
            )
        except StoreError as exc:
            done = exc
        if done is not True:
            await drive(flow.completed(data, done), self)
        return None

    async def fail(self, error: BaseException, started: bool) -> Answer | None:
        """See :meth:`Flow.failed`."""
        self.keeper.discard(self)
        return await drive(self.flow.failed(error, started), self)

    async def incomplete(self) -> None:
        """See :meth:`Flow.incomplete`."""
        self.keeper.discard(self)
        await drive(self.flow.incomplete(), self)


class AsyncCallRun(AsyncOperationRun[str, Call]):
    """One keyed call of an async function: its :class:`~retrysafe._core.call.Call` from the
    claim to the stored result.

    Args:
        runner: the function's runner.
        flow: the call.
    """

    __slots__ = ()

    async def invoke(
        self, function: Callable[..., Awaitable[Any]], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Run the call once per key: the stored result of the first call with this key, or
        ``function(*args, **kwargs)`` run now (with this run as the current call's context) and
        its result stored.

        Raises:
            KeyReusedError: the key was used with other arguments.
            InProgressError: the first call still runs (after waiting, with ``on_conflict``).
            OutcomeUnknownError: the first call's effects are committed, its result unknown.
            StoreError: the store failed (``on_store_error="fail_closed"``).
            CodecError: the stored result cannot be read, or this result cannot be stored.
            BaseException: what the function raised (or, replayed, its final exception).
        """
        verdict = await self.claim()
        if verdict is REPLAYED:
            return self.flow.value
        if verdict is not EXECUTE:  # fail-open after a store error: run unprotected
            return await function(*args, **kwargs)
        context = CURRENT_CALL.set(self)
        self.start()
        # Not a `finally`: compiled (mypyc), a coroutine's `finally` that waits while an
        # exception passes leaves that exception as the thread's current one, which later code
        # raises again (the next request's, even).
        try:
            try:
                tx = self.tx
                if tx is not None and getattr(tx, "begins_eagerly", False):
                    # An ORM's transaction (Django's atomic block): the function writes through
                    # the ORM, never asks for the connection, so the block opens before it runs.
                    await tx.connection()
                value = await function(*args, **kwargs)
            except BaseException as exc:
                await self.fail(exc)
                raise exc  # by name: compiled, a bare raise after a suspension can raise another
            await self.settle(value)
        except BaseException as exc:
            CURRENT_CALL.reset(context)
            await self.end()
            raise exc
        CURRENT_CALL.reset(context)
        await self.end()
        return value

    async def settle(self, value: Any) -> None:
        """See :meth:`Call.settle`."""
        flow = self.flow
        flow.observe(self.keeper.discard(self) - self.started)
        await drive(flow.settle(value), self)

    async def fail(self, error: BaseException) -> None:
        """See :meth:`Call.failed`."""
        self.keeper.discard(self)
        await drive(self.flow.failed(error), self)
