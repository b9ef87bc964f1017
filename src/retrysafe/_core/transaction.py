"""Transactional mode (DESIGN section 3.5): the handler's writes and the completion record commit
in one database transaction, so a crash leaves both or neither.

The middleware opens a transaction object per executing request and puts it in the ASGI scope;
the handler asks for the connection with :func:`transaction`, which begins the transaction lazily
(a handler that never asks pays nothing, and a slow handler holds no lock before it writes). When
the response is final, the middleware writes the fenced completion record on that connection and
commits; a failure or a released status rolls back and releases the key.

An idempotent function's call is found the same way without a request: the running call's
context is in :data:`CURRENT_CALL`, a context variable (so it follows the call into the tasks it
awaits, and never leaks into another call or thread).
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from .errors import ConfigurationError

__all__ = [
    "CONTEXT_SCOPE_KEY",
    "CURRENT_CALL",
    "AsyncTransaction",
    "ForwardedState",
    "Transaction",
    "TransactionState",
    "context_transaction",
    "mark_committed",
    "outcome_known",
    "sync_mark_committed",
    "sync_transaction",
    "transaction",
]

#: Where the middleware puts the executing request's context (ASGI scope, WSGI environ).
CONTEXT_SCOPE_KEY = "retrysafe.context"

#: The context of the idempotent function call running in this context (``None`` outside one).
CURRENT_CALL: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "retrysafe_current_call", default=None
)


class TransactionState(Protocol):
    """What both faces of a transaction say about it without I/O."""

    @property
    def begun(self) -> bool:
        """Whether the handler asked for the connection (so a transaction is open)."""
        ...

    @property
    def broken(self) -> bool:
        """Whether the transaction's connection has died (its work is lost)."""
        ...


class ForwardedState:
    """The state of a transaction that wraps another one, ``wrapped`` (an instrumented
    transaction, Django's async face of its sync one): read from the wrapped transaction."""

    __slots__ = ()

    wrapped: TransactionState

    @property
    def begun(self) -> bool:
        """See :attr:`TransactionState.begun`."""
        return self.wrapped.begun

    @property
    def broken(self) -> bool:
        """See :attr:`TransactionState.broken`."""
        return self.wrapped.broken

    @property
    def holds_write_lock(self) -> bool:
        """Whether the wrapped transaction holds its database's single write lock (SQLite)."""
        return bool(getattr(self.wrapped, "holds_write_lock", False))


@runtime_checkable
class AsyncTransaction(TransactionState, Protocol):
    """One request's database transaction, begun on first use."""

    async def connection(self) -> Any:
        """Begin the transaction if needed and return the driver connection it runs on."""
        ...

    async def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """Write the fenced completion record in the transaction and commit both.

        Returns:
            ``False`` (and rolls back) when the token no longer holds the key.
        """
        ...

    async def rollback(self) -> None:
        """Undo the handler's writes."""
        ...

    async def close(self) -> None:
        """Give the connection back (rolling back anything not committed)."""
        ...


@runtime_checkable
class Transaction(TransactionState, Protocol):
    """The synchronous twin of :class:`AsyncTransaction` (WSGI, Django)."""

    def connection(self) -> Any:
        """See :meth:`AsyncTransaction.connection`."""
        ...

    def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """See :meth:`AsyncTransaction.complete`."""
        ...

    def rollback(self) -> None:
        """See :meth:`AsyncTransaction.rollback`."""
        ...

    def close(self) -> None:
        """See :meth:`AsyncTransaction.close`."""
        ...


def current_context(request: Any) -> Any:
    """The running operation's context: the request's (``request`` a Starlette/FastAPI
    ``Request``, an ASGI scope or a WSGI environ), or with ``request=None`` the current
    idempotent call's; ``None`` when there is none."""
    if request is None:
        return CURRENT_CALL.get()
    scope: Mapping[str, Any] = getattr(request, "scope", request)
    return scope.get(CONTEXT_SCOPE_KEY)


def context_transaction(scope: Mapping[str, Any] | None, *, optional: bool) -> Any:
    """The transaction object of the request whose scope or environ this is (``None``: of the
    current idempotent call).

    Raises:
        ConfigurationError: there is none and ``optional`` is false.
    """
    context = current_context(scope)
    tx = None if context is None else context.transaction
    if tx is None and not optional:
        what = "call" if scope is None else "request"
        raise ConfigurationError(
            f"no idempotent transaction for this {what}: it carries no key, or it does not run "
            "in transactional mode (transactional=True with a SQL store)"
        )
    return tx


async def transaction(request: Any = None, *, optional: bool = False) -> Any:
    """Return the database connection of the current request's idempotent transaction.

    Args:
        request: a Starlette/FastAPI ``Request`` or an ASGI scope; inside an idempotent
            ``async def`` function, nothing (its call's transaction).
        optional: return ``None`` instead of raising when the request has no transaction
            (e.g. no key on a route where the key is optional).

    Returns:
        The driver connection (``sqlite3.Connection``, ``asyncpg.Connection``) in an open
        transaction; the handler's writes on it commit together with the stored response.

    Raises:
        ConfigurationError: the request does not run in transactional mode (no key, a replay,
            or ``transactional=True`` is not set on the middleware).
    """
    tx = context_transaction(
        None if request is None else getattr(request, "scope", request), optional=optional
    )
    return None if tx is None else await tx.connection()


async def mark_committed(request: Any = None) -> bool:
    """Declare that the request's side effects are committed (non-transactional mode).

    Call it right after the effect (the order row committed, the payment captured). From then
    on the key is never run again: if the process dies before its response is stored, retries
    get ``409`` ``idempotency-outcome-unknown`` until an operator resolves the key
    (``retrysafe resolve``) or its retention ends, instead of a second execution. Before the
    call, a crash lets a retry run after the lease (nothing was done). One store round trip; in
    transactional mode a no-op (the effects commit with the record).

    Args:
        request: a Starlette/FastAPI ``Request`` or an ASGI scope; inside an idempotent
            ``async def`` function, nothing (its call).

    Returns:
        ``True`` when recorded (or the request has no key: nothing to protect); ``False`` when
        the store could not be reached or the lease was lost.
    """
    context = current_context(request)
    if context is None:
        return True
    ok: bool = await context.mark_committed()
    return ok


def sync_transaction(environ: Mapping[str, Any] | None = None, *, optional: bool = False) -> Any:
    """The synchronous twin of :func:`transaction`: the database connection of the current
    idempotent transaction, for a ``def`` idempotent function (nothing to pass) or a WSGI request
    (its environ).

    Args:
        environ: the request's WSGI environ; inside an idempotent ``def`` function, nothing.
        optional: return ``None`` instead of raising when there is no transaction.

    Returns:
        The driver connection (``sqlite3.Connection``, ``psycopg.Connection``, Django's
        connection) in an open transaction: the writes on it commit together with the stored
        outcome.

    Raises:
        ConfigurationError: not in transactional mode (no key, a replay, ``transactional=True``
            not set), or inside an ``async def`` (use ``await retrysafe.transaction()``).
    """
    tx = context_transaction(environ, optional=optional)
    if tx is None:
        return None
    if inspect.iscoroutinefunction(tx.connection):
        raise ConfigurationError("inside an async def function use: await retrysafe.transaction()")
    return tx.connection()


def sync_mark_committed(environ: Mapping[str, Any] | None = None) -> bool:
    """The synchronous twin of :func:`mark_committed`, for a ``def`` idempotent function (nothing
    to pass) or a WSGI request (its environ): from now on the key never runs again; if the
    process dies before the outcome is stored, duplicates get "outcome unknown".

    Returns:
        ``True`` when recorded (or outside an idempotent call or keyed request: nothing to
        protect); ``False`` when the store could not be reached or the lease was lost.

    Raises:
        ConfigurationError: called inside an ``async def`` (use
            ``await retrysafe.mark_committed()``).
    """
    context = current_context(environ)
    if context is None:
        return True
    if inspect.iscoroutinefunction(context.mark_committed):
        raise ConfigurationError(
            "inside an async def function use: await retrysafe.mark_committed()"
        )
    return bool(context.mark_committed())


def outcome_known(request: Any) -> None:
    """Undo :func:`mark_committed` for a request whose effect turned out to have a definite
    answer (e.g. a proxied upstream replied in full): its status decides again whether the key is
    stored or released. A no-op for a request without a key."""
    scope: Mapping[str, Any] = getattr(request, "scope", request)
    context = scope.get(CONTEXT_SCOPE_KEY)
    if context is not None:
        context.flow.outcome_known()
