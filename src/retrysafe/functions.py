"""Idempotent functions: any ``def`` or ``async def`` run once per key, with the guarantees of a
request (leases renewed while it runs, fencing, takeover from a dead caller, the stored result
returned to every duplicate, "outcome unknown" after committed effects, and the result committed
in the same SQL transaction as the function's writes)::

    from retrysafe import idempotent_function

    @idempotent_function(store="sqlite:///app.db", key=lambda order_id, amount: order_id)
    def charge(order_id: str, amount: int) -> dict:
        ...

A thin shell, like the HTTP ones: :mod:`retrysafe._core.call` keys, fingerprints and decides;
the runner (``_async/runner.py`` and its generated sync twin) performs. Inside the function,
:func:`retrysafe.mark_committed` and :func:`retrysafe.transaction` (``async def``), or
:func:`mark_committed` and :func:`transaction` of this module (``def``), find the running call
without any argument.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import types
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Generic, ParamSpec, TypeVar, cast, overload

from ._async._keeper import AsyncLeaseKeeper
from ._async.runner import AsyncCallRun, AsyncRunner
from ._core.call import KEY_ARGUMENT, Call, CallSpec, ResultCodec, call_config, call_record_id
from ._core.config import IdempotencyConfig
from ._core.errors import ConfigurationError
from ._core.transaction import CURRENT_CALL, context_transaction
from ._sync._keeper import LeaseKeeper
from ._sync.runner import CallRun, Runner
from .stores import AsyncStore, Store, async_store_from_url, resolve_async_store, store_from_url
from .stores._inline import InlineAsyncStore

__all__ = ["IdempotentFunction", "idempotent_function", "mark_committed", "transaction"]

P = ParamSpec("P")
R = TypeVar("R")


class _Keepers:
    """The process's lease keepers for idempotent functions, made on first use."""

    @functools.cached_property
    def sync(self) -> LeaseKeeper:
        return LeaseKeeper()

    @functools.cached_property
    def aio(self) -> AsyncLeaseKeeper:
        return AsyncLeaseKeeper()


_keepers = _Keepers()


class IdempotentFunction(Generic[P, R]):
    """A function made idempotent by :func:`idempotent_function`: call it as the function.

    Besides the function's own arguments a call may carry its key as ``idempotency_key=...``
    (unless the function has a parameter of that name, which then is the key);
    :meth:`with_key` does the same for type checkers.

    Attributes:
        name: what the function's keys are scoped by.
        store: the store its records live in.
        config: its settings.
    """

    def __init__(
        self, function: Callable[P, R], spec: CallSpec, config: IdempotencyConfig, store: Any
    ) -> None:
        functools.update_wrapper(self, function)
        self._function = function
        self._spec = spec
        self.name = spec.name
        self.config = config
        self.store = store
        self._is_async = inspect.iscoroutinefunction(function)
        # One lease keeper for every idempotent function of the process (one renewal thread for
        # all def functions, one sweeping task per event loop for all async ones).
        self._async_runner = AsyncRunner(store, _keepers.aio) if self._is_async else None
        self._runner = None if self._is_async else Runner(store, _keepers.sync)
        #: Django's ORM store keeps a label per record (its admin shows it): the route of a
        #: request, ``call <name>`` of a call. Set around the reservation, in the caller's context.
        self._label = _django_label(store)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        call, call_kwargs = self.prepare(args, kwargs)
        return self.invoke(call, args, call_kwargs)

    def prepare(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Call, dict[str, Any]]:
        """One call's keyed operation and the keyword arguments to run the function with (for
        shells built on this function: message consumers, task queues)."""
        key, fingerprint, call_kwargs = self._spec.prepare(args, kwargs)
        return Call(self.config, self._spec, key, fingerprint), call_kwargs

    def invoke(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
        """Run ``call`` (from :meth:`prepare`): the stored outcome, or the function now. For an
        ``async def`` function, the coroutine that does it."""
        function: Any = self._function
        if self._runner is None:
            assert self._async_runner is not None
            pending = AsyncCallRun(self._async_runner, call).invoke(function, args, kwargs)
            return cast(R, pending if self._label is None else self._labelled(pending))
        if self._label is None:
            return cast(R, CallRun(self._runner, call).invoke(function, args, kwargs))
        token = self._label.set(f"call {self.name}")
        try:
            return cast(R, CallRun(self._runner, call).invoke(function, args, kwargs))
        finally:
            self._label.reset(token)

    async def _labelled(self, pending: Awaitable[Any]) -> Any:
        assert self._label is not None
        token = self._label.set(f"call {self.name}")
        try:
            return await pending
        finally:
            self._label.reset(token)

    @property
    def computes_key(self) -> bool:
        """Whether the function's calls carry their key in their arguments (``key=`` was given,
        or the function has an ``idempotency_key`` parameter): a task queue's shell falls back
        to the task's id only when they do not."""
        spec = self._spec
        return spec.key is not None or bool(spec.key_names) or spec.takes_key

    @property
    def is_async(self) -> bool:
        """Whether the function is an ``async def``."""
        return self._is_async

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        # Decorating a method: bind it like a function would be bound.
        return self if instance is None else types.MethodType(self, instance)

    def with_key(self, key: str) -> Callable[P, R]:
        """This function with the key given now (rather than computed from the arguments)."""

        def keyed(*args: P.args, **kwargs: P.kwargs) -> R:
            return self(*args, **{**kwargs, KEY_ARGUMENT: key})  # type: ignore[arg-type]

        return keyed

    def record_id(self, key: str) -> str:
        """The store address of ``key`` for this function (what ``retrysafe inspect --function
        NAME --key KEY`` looks up)."""
        return call_record_id(self.name, key)

    def close(self) -> None:
        """Close the store (of a ``def`` function; see :meth:`aclose` for an ``async def``)."""
        self.store.close()

    async def aclose(self) -> None:
        """Close the store (of an ``async def`` function)."""
        await self.store.aclose()

    def __repr__(self) -> str:
        return f"<idempotent function {self.name}>"


@overload
def idempotent_function(
    function: Callable[P, R],
    /,
    *,
    store: str | AsyncStore | Store,
    key: Callable[..., Any] | str | Sequence[str] | None = None,
    name: str | None = None,
    fingerprint: Sequence[str] | None = None,
    codec: str | ResultCodec = "json",
    final: Iterable[type[BaseException]] = (),
    config: IdempotencyConfig | None = None,
    **options: Any,
) -> IdempotentFunction[P, R]: ...


@overload
def idempotent_function(
    function: None = None,
    /,
    *,
    store: str | AsyncStore | Store,
    key: Callable[..., Any] | str | Sequence[str] | None = None,
    name: str | None = None,
    fingerprint: Sequence[str] | None = None,
    codec: str | ResultCodec = "json",
    final: Iterable[type[BaseException]] = (),
    config: IdempotencyConfig | None = None,
    **options: Any,
) -> Callable[[Callable[P, R]], IdempotentFunction[P, R]]: ...


def idempotent_function(
    function: Callable[P, R] | None = None,
    /,
    *,
    store: str | AsyncStore | Store,
    key: Callable[..., Any] | str | Sequence[str] | None = None,
    name: str | None = None,
    fingerprint: Sequence[str] | None = None,
    codec: str | ResultCodec = "json",
    final: Iterable[type[BaseException]] = (),
    config: IdempotencyConfig | None = None,
    **options: Any,
) -> IdempotentFunction[P, R] | Callable[[Callable[P, R]], IdempotentFunction[P, R]]:
    """Make a ``def`` or ``async def`` function run once per key.

    The first call with a key runs the function and stores its result; every later call with
    the key (in any process sharing the store) gets the stored result without running it.
    While the first still runs, a duplicate raises :class:`~retrysafe.InProgressError` (or,
    with ``on_conflict="wait"``, waits up to ``conflict_wait`` seconds for the result). A key
    used again with other arguments raises :class:`~retrysafe.KeyReusedError`. An exception
    frees the key (the next call runs), unless its type is listed in ``final``: then it is the
    stored outcome, raised again (same type, same message) to every duplicate.

    Args:
        function: the function (when used as ``@idempotent_function`` without options).
        store: a store URL (``"sqlite:///app.db"``, ``"postgresql://..."``, ``"redis://..."``,
            ``"memory://"``, ``"django://alias"``) or a store instance (a synchronous one for a
            ``def`` function; an async one, or a local synchronous one, for ``async def``).
        key: where the key comes from: a callable over the arguments (called like the
            function, returns a ``str`` or ``int``), a parameter name, or several (their values'
            JSON is the key). Without it, each call passes ``idempotency_key=...``; a key passed
            at call time always wins.
        name: what the keys are scoped by (default: the function's qualified name). Two
            functions with one name share their keys.
        fingerprint: the parameter names that identify the call (default: every argument but
            ``self``/``cls``); a key reused with different values raises ``KeyReusedError``.
        codec: how results are stored: ``"json"`` (default: JSON data, dataclasses and
            Pydantic models round-trip by the return annotation), ``"pickle"`` (only when every
            writer to the store is trusted), or a :class:`~retrysafe._core.call.ResultCodec`.
        final: exception types that are outcomes, not failures.
        config: an :class:`~retrysafe.IdempotencyConfig`; or pass its call options as keywords.
        **options: ``ttl``, ``lease``, ``on_conflict``, ``conflict_wait``, ``on_store_error``,
            ``transactional``, ``on_event``, ``adaptive_retry_after``
            (see :class:`~retrysafe.IdempotencyConfig`).

    Returns:
        The idempotent function (or, without ``function``, the decorator).

    Raises:
        ConfigurationError: a bad option (named), an unknown store scheme or a missing extra,
            or ``transactional=True`` without a SQL store: at decoration, never per call.
    """

    def decorate(target: Callable[P, R]) -> IdempotentFunction[P, R]:
        spec = CallSpec(
            target, name=name, key=key, fingerprint=fingerprint, codec=codec, final=final
        )
        settings = call_config(config, options, where=f"idempotent_function({spec.name})")
        if inspect.iscoroutinefunction(target):
            resolved: Any = _async_store(store)
        else:
            resolved = _sync_store(store)
        if settings.transactional and not callable(getattr(resolved, "begin", None)):
            raise ConfigurationError(
                f"idempotent_function({spec.name}): transactional=True needs a SQL store "
                f"(SQLite, PostgreSQL, MySQL or Django's ORM), not {type(resolved).__name__}"
            )
        return IdempotentFunction(target, spec, settings, resolved)

    return decorate if function is None else decorate(function)


def _django_label(store: object) -> contextvars.ContextVar[str] | None:
    """The Django ORM store's record label (its ``current_route``), for a Django store."""
    if type(store).__name__ not in ("DjangoStore", "AsyncDjangoStore"):
        return None
    from .contrib.django.store import current_route

    return current_route


def _is_django(store: object) -> bool:
    return isinstance(store, str) and (store == "django" or store.startswith("django://"))


def _sync_store(store: object) -> Store:
    """The synchronous store a ``def`` function's ``store=`` names."""
    if _is_django(store):
        from .contrib.django.store import DjangoStore

        return DjangoStore.from_url(str(store))
    if isinstance(store, str):
        return store_from_url(store)
    if isinstance(store, InlineAsyncStore):
        return store.sync  # the sync face of a local store (memory, SQLite): the same records
    if isinstance(store, Store) and not hasattr(store, "aclose"):
        return store
    raise ConfigurationError(
        f"store: a def function needs a store URL or a synchronous store, not {store!r}"
    )


def _async_store(store: object) -> AsyncStore:
    """The async store an ``async def`` function's ``store=`` names."""
    if _is_django(store) or type(store).__name__ == "DjangoStore":
        from .contrib.django.store import AsyncDjangoStore, DjangoStore

        sync = DjangoStore.from_url(str(store)) if isinstance(store, str) else store
        assert isinstance(sync, DjangoStore)
        return AsyncDjangoStore(sync)
    if isinstance(store, str):
        return async_store_from_url(store)
    return resolve_async_store(store)  # type: ignore[arg-type]


# -- inside a def function ----------------------------------------------------------------------


def transaction(*, optional: bool = False) -> Any:
    """The database connection of the running ``def`` function's idempotent transaction (the
    sync twin of ``await retrysafe.transaction()``).

    Args:
        optional: return ``None`` instead of raising when the call has no transaction.

    Returns:
        The driver connection (``sqlite3.Connection``, ``psycopg.Connection``, Django's
        connection) in an open transaction: the function's writes on it commit together with its
        stored result.

    Raises:
        ConfigurationError: not inside an idempotent ``def`` function in transactional mode.
    """
    tx = context_transaction(None, optional=optional)
    if tx is None:
        return None
    if isinstance(CURRENT_CALL.get(), AsyncCallRun):
        raise ConfigurationError("inside an async def function use: await retrysafe.transaction()")
    return tx.connection()


def mark_committed() -> bool:
    """Declare the running ``def`` function's side effects committed (the sync twin of ``await
    retrysafe.mark_committed()``): from now on its key never runs again; if the process dies
    before the result is stored, duplicates get :class:`~retrysafe.OutcomeUnknownError`.

    Returns:
        ``True`` when recorded (or outside an idempotent call: nothing to protect); ``False``
        when the store could not be reached or the lease was lost.

    Raises:
        ConfigurationError: called inside an ``async def`` idempotent function.
    """
    context = CURRENT_CALL.get()
    if context is None:
        return True
    if isinstance(context, AsyncCallRun):
        raise ConfigurationError(
            "inside an async def function use: await retrysafe.mark_committed()"
        )
    return bool(context.mark_committed())
