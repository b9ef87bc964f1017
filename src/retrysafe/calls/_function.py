"""The function decorator: :func:`idempotent_function` and the :class:`IdempotentFunction` it
makes, with the one :meth:`~IdempotentFunction.deliver` every message front runs a delivery by.

A thin shell, like the HTTP ones: :mod:`retrysafe._core.call` keys, fingerprints and decides;
the runner (``_async/runner.py`` and its generated sync twin) performs. The store is whatever
the store registry makes of ``store=`` (a URL of any registered scheme, ``django`` included, or
an instance): this module names no backend.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import sys
import types
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Generic, ParamSpec, TypeVar, Unpack, cast, overload

from .._async._keeper import AsyncLeaseKeeper
from .._async.runner import AsyncCallRun, AsyncRunner
from .._core.call import KEY_ARGUMENT, Call, CallSpec, call_record_id
from .._core.config import IdempotencyConfig
from .._core.errors import ConfigurationError
from .._sync._keeper import LeaseKeeper
from .._sync.runner import CallRun, Runner
from ..stores import AsyncStore, Store, resolve_async_store, resolve_store
from ..stores._inline import InlineAsyncStore
from ._delivery import REFUSALS, Delivery, DeliveryOptions, refused
from ._options import FunctionOptions, call_config, split_options

__all__ = ["IdempotentFunction", "idempotent_function", "make_function"]

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
        #: A store may keep a label per record (Django's admin shows it: the route of a request,
        #: ``call <name>`` of a call); it names the context variable to set around a call.
        self._label: contextvars.ContextVar[str] | None = getattr(store, "record_label", None)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        call, call_kwargs = self.prepare(args, kwargs)
        return self.invoke(call, args, call_kwargs)

    def prepare(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Call, dict[str, Any]]:
        """One call's keyed operation and the keyword arguments to run the function with."""
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

    # -- one delivery of a message ------------------------------------------------------------

    def _keyed(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], message: DeliveryOptions
    ) -> tuple[Call, dict[str, Any]]:
        key = message.get("key")
        if key is None and KEY_ARGUMENT not in kwargs and not self.computes_key:
            key = message.get("fallback")
        if key is not None:
            kwargs = {**kwargs, KEY_ARGUMENT: key}
        return self.prepare(args, kwargs)

    def deliver(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], **message: Unpack[DeliveryOptions]
    ) -> Delivery:
        """One delivery of a message to a ``def`` function: what it came to (every message front
        runs a delivery through here: the consumer, Celery, Dramatiq...).

        Args:
            args: the function's positional arguments.
            kwargs: its keyword arguments (with ``idempotency_key=`` when the producer put the
                key there).
            **message: :class:`~retrysafe.calls.DeliveryOptions`: the message's ``key``, the
                ``fallback`` key, ``queue``.

        Returns:
            The :class:`Delivery` (``key_reused``, ``outcome_unknown`` carry the error).

        Raises:
            StoreError: the store failed, and not ``queue``.
            InvalidKeyError: no key, or a malformed one.
            BaseException: what the function raised (its key is freed: the next delivery runs
                it), or a final exception (stored, raised for every copy).
        """
        call, call_kwargs = self._keyed(args, kwargs, message)
        try:
            result = self.invoke(call, args, call_kwargs)
        except REFUSALS as error:
            return refused(error, queue=message.get("queue", False))
        return Delivery("replayed" if call.replayed else "executed", result)

    async def adeliver(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], **message: Unpack[DeliveryOptions]
    ) -> Delivery:
        """:meth:`deliver` for an ``async def`` function."""
        call, call_kwargs = self._keyed(args, kwargs, message)
        try:
            pending: Awaitable[Any] = self.invoke(call, args, call_kwargs)  # type: ignore[assignment]
            result = await pending
        except REFUSALS as error:
            return refused(error, queue=message.get("queue", False))
        return Delivery("replayed" if call.replayed else "executed", result)

    def passthrough(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The function as written, for a test that turned idempotency off: an
        ``idempotency_key=`` meant for the wrapper is dropped, unless the function takes a
        parameter of that name itself."""
        if not self._spec.takes_key and KEY_ARGUMENT in kwargs:
            kwargs = {k: v for k, v in kwargs.items() if k != KEY_ARGUMENT}
        return self._function(*args, **kwargs)

    # -- about the function -------------------------------------------------------------------

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


def make_function(
    target: Callable[P, R],
    store: str | AsyncStore | Store,
    options: FunctionOptions,
    *,
    where: str = "idempotent_function",
    localns: Mapping[str, Any] | None = None,
) -> IdempotentFunction[P, R]:
    """``target`` made idempotent with ``options``: what every call front builds on.

    Raises:
        ConfigurationError: a bad option (named), an unknown store scheme or a missing extra,
            or ``transactional=True`` without a SQL store.
    """
    spec_options, rest = split_options(options)
    spec = CallSpec(target, localns=localns, **spec_options)
    config = rest.pop("config", None)
    settings = call_config(config, rest, where=f"{where}({spec.name})")
    resolved: Any = (
        _async_store(store) if inspect.iscoroutinefunction(target) else _sync_store(store)
    )
    if settings.transactional and not callable(getattr(resolved, "begin", None)):
        raise ConfigurationError(
            f"{where}({spec.name}): transactional=True needs a SQL store "
            f"(SQLite, PostgreSQL, MySQL or Django's ORM), not {type(resolved).__name__}"
        )
    return IdempotentFunction(target, spec, settings, resolved)


@overload
def idempotent_function(
    function: Callable[P, R],
    /,
    *,
    store: str | AsyncStore | Store,
    **options: Unpack[FunctionOptions],
) -> IdempotentFunction[P, R]: ...


@overload
def idempotent_function(
    function: None = None, /, *, store: str | AsyncStore | Store, **options: Unpack[FunctionOptions]
) -> Callable[[Callable[P, R]], IdempotentFunction[P, R]]: ...


def idempotent_function(
    function: Callable[P, R] | None = None,
    /,
    *,
    store: str | AsyncStore | Store,
    **options: Unpack[FunctionOptions],
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
        **options: :class:`~retrysafe.calls.FunctionOptions`:

            - ``key``: where the key comes from: a callable over the arguments (called like
              the function, returns a ``str`` or ``int``), a parameter name, or several (their
              values' JSON is the key). Without it, each call passes ``idempotency_key=...``; a
              key passed at call time always wins.
            - ``name``: what the keys are scoped by (default: the function's qualified name).
              Two functions with one name share their keys.
            - ``fingerprint``: the parameter names that identify the call (default: every
              argument but ``self``/``cls``); a key reused with different values raises
              ``KeyReusedError``.
            - ``codec``: how results are stored: ``"json"`` (default: JSON data, dataclasses
              and Pydantic models round-trip by the return annotation), ``"pickle"`` (only when
              every writer to the store is trusted), or a
              :class:`~retrysafe._core.call.ResultCodec`.
            - ``final``: exception types that are outcomes, not failures.
            - ``config``: an :class:`~retrysafe.IdempotencyConfig`; or its call options as
              keywords (:class:`~retrysafe.calls.CallOptions`: ``ttl``, ``lease``,
              ``on_conflict``, ``conflict_wait``, ``on_store_error``, ``transactional``,
              ``on_event``, ``adaptive_retry_after``).

    Returns:
        The idempotent function (or, without ``function``, the decorator).

    Raises:
        ConfigurationError: a bad option (named), an unknown store scheme or a missing extra,
            or ``transactional=True`` without a SQL store: at decoration, never per call.
    """

    # Where the function is decorated: a return annotation naming a class defined there (inside
    # a function) is resolved in it.
    localns = sys._getframe(1).f_locals

    def decorate(target: Callable[P, R]) -> IdempotentFunction[P, R]:
        return make_function(target, store, options, localns=localns)

    return decorate if function is None else decorate(function)


def _sync_store(store: object) -> Store:
    """The synchronous store a ``def`` function's ``store=`` names."""
    if isinstance(store, InlineAsyncStore):
        return store.sync  # the sync face of a local store (memory, SQLite): the same records
    try:
        return resolve_store(store)  # type: ignore[arg-type]
    except ConfigurationError:
        if isinstance(store, str):
            raise
    raise ConfigurationError(
        f"store: a def function needs a store URL or a synchronous store, not {store!r}"
    )


def _async_store(store: object) -> AsyncStore:
    """The async store an ``async def`` function's ``store=`` names."""
    return resolve_async_store(store)  # type: ignore[arg-type]
