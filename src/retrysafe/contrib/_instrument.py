"""A store that wraps another and observes each operation (latency metrics, trace spans).

Shared by :mod:`retrysafe.contrib.prometheus` and :mod:`retrysafe.contrib.otel`; imports neither
library. :func:`instrument` builds an instrumented store with two faces: the async one
(``_instrument_async.py``, for ASGI) and the sync one (``_instrument_sync.py``, generated from it,
for WSGI, Flask and Django). Each face gives the other when a middleware asks for it
(``as_sync()`` / ``as_async()``, which :func:`~retrysafe.stores.resolve_store` and
:func:`~retrysafe.stores.resolve_async_store` call), so the one store ``wire()`` returns suits
every front; both faces report to the same observer. Wrappers nest: a store wrapped for
Prometheus can be wrapped again for OpenTelemetry.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from .._core.errors import ConfigurationError
from ..stores import AsyncStore, Store, resolve_async_store, resolve_store
from ..stores._inline import InlineAsyncStore
from ._instrument_async import InstrumentedStore
from ._instrument_async import wrap as wrap_async
from ._instrument_sync import wrap as wrap_sync

__all__ = [
    "OUTCOMES",
    "InstrumentedStore",
    "Observe",
    "async_face",
    "instrument",
    "store_kind",
    "sync_face",
]

#: ``on_event`` event -> the request's outcome (the metrics' ``outcome`` label, the span's
#: ``idempotency.outcome``).
OUTCOMES: dict[str, str] = {
    "executed": "executed",
    "replayed": "replayed",
    "conflict": "in_progress",
    "mismatch": "mismatch",
    "invalid_key": "invalid_key",
    "missing_key": "missing_key",
    "too_large": "too_large",
    "store_error": "store_unavailable",
    "fail_open": "fail_open",
    "outcome_unknown": "outcome_unknown",
}

#: Returns a context manager that observes one store operation, given the operation's name.
Observe = Callable[[str], AbstractContextManager[Any]]


def store_kind(store: object) -> str:
    """A short, bounded name for a store's backend (a metric label): ``sqlite``, ``redis``...

    Args:
        store: a store instance (async, inline-wrapped sync, or instrumented).

    Returns:
        The store's own ``kind`` (its backend says it), else the lower-case class name.
    """
    inner = getattr(store, "inner", None) or getattr(store, "sync", None)
    if inner is not None and inner is not store:
        return store_kind(inner)
    kind = getattr(type(store), "kind", None)
    return kind if isinstance(kind, str) else type(store).__name__.lower()


def sync_face(source: object, inner: AsyncStore) -> Store:
    """The synchronous store under an instrumented async one (its ``as_sync()``).

    Args:
        source: what the async face was built from (a URL or a store object).
        inner: the async store it wraps.

    Raises:
        ConfigurationError: ``source`` is an async store object (say ``AsyncRedisStore(...)``):
            it has no synchronous face; the message says to pass the URL instead.
    """
    if isinstance(inner, InlineAsyncStore):  # memory, SQLite: the very same store
        return inner.sync
    unfit = f"{type(source).__name__}, an async store object, which WSGI, Flask and Django"
    face: Store = _face(resolve_store, source, unfit, "a synchronous store")
    return face


def async_face(source: object, inner: Store) -> AsyncStore:
    """The async store under an instrumented synchronous one (its ``as_async()``).

    Args:
        source: what the sync face was built from (a URL or a store object).
        inner: the synchronous store it wraps.

    Raises:
        ConfigurationError: ``source`` is a synchronous network store object (say
            ``RedisStore(...)``): it has no async face; the message says to pass the URL.
    """
    unfit = f"{type(inner).__name__}, a synchronous store object, which the ASGI middleware"
    face: AsyncStore = _face(resolve_async_store, source, unfit, "an async store")
    return face


def _face(resolve: Callable[[Any], Any], source: object, unfit: str, instead: str) -> Any:
    """``resolve(source)``; its error says what to give ``wire()`` instead."""
    try:
        return resolve(source)
    except ConfigurationError as exc:
        raise ConfigurationError(
            f"the instrumented store wraps {unfit} cannot use: give wire() (or instrument()) "
            f"the store URL or {instead} instead"
        ) from exc


def _sync_only(store: object) -> bool:
    """A synchronous store object with no async face (sync Redis, PostgreSQL)."""
    return (
        isinstance(store, Store)
        and not hasattr(store, "aclose")
        and not callable(getattr(store, "as_async", None))
        and not getattr(store, "inline_safe", False)
    )


def instrument(store: str | AsyncStore | Store, observe: Observe) -> Any:
    """Wrap a store (URL, async or sync store) so that ``observe`` sees every operation.

    Args:
        store: what a middleware accepts as ``store``.
        observe: ``observe(operation)`` returns the context manager around one call; it sees
            the exception of a failed call in ``__exit__``.

    Returns:
        The async face (:class:`InstrumentedStore`), or the sync face when ``store`` is a
        synchronous store object that has no async face (sync Redis or PostgreSQL). Either
        gives the other when a middleware asks; each has ``begin`` exactly when the wrapped
        store has it.

    Raises:
        ConfigurationError: ``store`` is not a store or store URL.
    """
    if _sync_only(store):
        return wrap_sync(resolve_store(store), observe, store)  # type: ignore[arg-type]
    return wrap_async(resolve_async_store(store), observe, store)
