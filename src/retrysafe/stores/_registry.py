"""Which backend serves which store URL: a registry that knows no backend by name.

A backend declares itself (:class:`Backend`: its schemes, its store classes, its URL options, the
extra that installs its driver) and registers, either by a call (:func:`register_backend`, what
the built-in packages do when they are imported) or by an entry point in the
``retrysafe.stores`` group, named by the scheme and pointing at the :class:`Backend`::

    [project.entry-points."retrysafe.stores"]
    mystore = "mypackage.store:BACKEND [mystore]"

Entry points are looked at only for a scheme no call registered, so an installed package costs
nothing until its scheme is used. Store classes are named as ``"module:Class"`` and imported on
first use: declaring a backend never imports its driver, and a missing driver is a
:class:`~retrysafe.ConfigurationError` naming the ``pip install`` to run, raised only when its
scheme is used.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from .._core.errors import ConfigurationError
from ._base import AsyncStore, Store
from ._inline import InlineAsyncStore
from ._url import Option, StoreURL, interpret, split_url

__all__ = [
    "ENTRY_POINT_GROUP",
    "Backend",
    "async_store_from_url",
    "lazy_classes",
    "parse_store_url",
    "register_backend",
    "resolve_async_store",
    "resolve_store",
    "schemes",
    "store_from_url",
]

ENTRY_POINT_GROUP = "retrysafe.stores"


@dataclass(frozen=True)
class Backend:
    """A store backend, as it declares itself.

    Both store classes build themselves with a classmethod ``from_url(url: StoreURL)``: the URL
    split once, with the backend's own query options converted in ``url.options``.

    Attributes:
        name: the backend's name (``"postgres"``), in messages.
        schemes: the URL schemes it serves, lower-case (``("postgresql", "postgres")``).
        store: the synchronous store class, or ``"module:Class"`` to import on first use.
        async_store: the async store class likewise; ``None`` runs the synchronous store inline
            on the event loop (only for a store whose calls never wait on the network: its
            ``inline_safe`` attribute is true).
        options: the query options it takes: name -> converter (``str`` -> the constructor's
            value; raises ``ValueError`` with the reason). Anything else is refused...
        passed: ...except these, left in the URL for the driver (``None``: any other option).
        extra: the ``retrysafe`` extra that installs its driver (``"redis"``), for the message
            when the driver is missing.
    """

    name: str
    schemes: tuple[str, ...]
    store: type | str
    async_store: type | str | None = None
    options: Mapping[str, Option] = field(default_factory=dict)
    passed: frozenset[str] | None = frozenset()
    extra: str | None = None

    def install_hint(self) -> str:
        """What to run when the driver is missing."""
        return f"pip install 'retrysafe[{self.extra}]'" if self.extra else "install its driver"


_lock = threading.Lock()
_by_scheme: dict[str, Backend] = {}


def register_backend(backend: Backend, *, replace: bool = False) -> None:
    """Serve ``backend.schemes`` with ``backend``.

    Args:
        backend: the declaration.
        replace: take over schemes another backend serves (otherwise refused).

    Raises:
        ConfigurationError: a scheme is served by another backend.
    """
    with _lock:
        for scheme in backend.schemes:
            held = _by_scheme.get(scheme)
            if held is not None and held != backend and not replace:
                raise ConfigurationError(
                    f"the {scheme}:// store scheme is taken by the {held.name} backend"
                )
        for scheme in backend.schemes:
            _by_scheme[scheme] = backend


def _entry_points() -> Iterable[metadata.EntryPoint]:
    return metadata.entry_points(group=ENTRY_POINT_GROUP)


def _from_entry_point(scheme: str) -> Backend | None:
    """The backend an installed package declares for ``scheme``, registered on the way."""
    for point in _entry_points():
        if point.name.lower() != scheme:
            continue
        try:
            backend = point.load()
        except ImportError as exc:
            dist = point.dist.name if point.dist is not None else "the package that provides it"
            extras = f"[{','.join(point.extras)}]" if point.extras else ""
            raise ConfigurationError(
                f"the {scheme}:// store cannot be loaded: pip install '{dist}{extras}' ({exc})"
            ) from exc
        if not isinstance(backend, Backend) or scheme not in backend.schemes:
            raise ConfigurationError(
                f"entry point {point.name} = {point.value} ({ENTRY_POINT_GROUP}) is not a "
                f"retrysafe.stores.Backend serving {scheme}://"
            )
        register_backend(backend)
        return backend
    return None


def schemes() -> list[str]:
    """Every scheme a store URL may use: the registered ones and those of entry points."""
    return sorted({*_by_scheme, *(p.name.lower() for p in _entry_points())})


def _backend(scheme: str, url: str) -> Backend:
    backend = _by_scheme.get(scheme) or _from_entry_point(scheme)
    if backend is None:
        given = url.split("://", 1)[0] if "://" in url else url
        known = ", ".join(s + "://" for s in schemes())
        raise ConfigurationError(f"unknown store URL scheme in {given!r}: use {known}")
    return backend


def parse_store_url(url: str) -> StoreURL:
    """Split a store URL and turn its query options into its backend's constructor options.

    Raises:
        ConfigurationError: an unknown scheme, an option the backend does not take, or a bad
            value.
    """
    split = split_url(url)
    backend = _backend(split.scheme, url)
    return interpret(split, backend.options, backend.passed)


def lazy_classes(package: str, modules: Mapping[str, str]) -> Callable[[str], Any]:
    """A backend package's module ``__getattr__``: its classes (``name`` -> submodule) are
    imported, with their driver, on first use, so registering the package imports no driver."""

    def __getattr__(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__


def _load(backend: Backend, ref: type | str, scheme: str) -> Any:
    if not isinstance(ref, str):
        return ref
    module_name, _, name = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        missing = getattr(exc, "name", None) or ""
        if missing == "retrysafe" or missing.startswith("retrysafe."):
            raise  # our own bug, not a missing driver
        raise ConfigurationError(
            f"the {scheme}:// store needs an extra: {backend.install_hint()} ({exc})"
        ) from exc
    return getattr(module, name)


def store_from_url(url: str) -> Store:
    """Build the synchronous store a URL names; see :func:`async_store_from_url`."""
    parsed = parse_store_url(url)
    backend = _by_scheme[parsed.scheme]
    store: Store = _load(backend, backend.store, parsed.scheme).from_url(parsed)
    return store


def async_store_from_url(url: str) -> AsyncStore:
    """Build the async store a URL names.

    Args:
        url: ``memory://``, ``sqlite:///path.db``, ``postgresql://...``, ``redis://...``, or a
            scheme a third-party backend registered.

    Returns:
        The store (connections are opened lazily).

    Raises:
        ConfigurationError: unknown scheme, a bad option, or the extra that the scheme needs is
            not installed.
    """
    parsed = parse_store_url(url)
    backend = _by_scheme[parsed.scheme]
    if backend.async_store is None:
        return InlineAsyncStore(_load(backend, backend.store, parsed.scheme).from_url(parsed))
    store: AsyncStore = _load(backend, backend.async_store, parsed.scheme).from_url(parsed)
    return store


def resolve_async_store(store: str | AsyncStore | Store) -> AsyncStore:
    """Accept a URL, an async store, or a synchronous store that has an async face.

    A synchronous store gets the face it names with an ``as_async()`` method (the Django ORM
    store's thread hop), or, when its calls never wait on the network (``inline_safe``), runs
    inline on the event loop.

    Raises:
        ConfigurationError: the object is not a store, or is a network sync store.
    """
    if isinstance(store, str):
        return async_store_from_url(store)
    if isinstance(store, AsyncStore):
        return store
    if isinstance(store, Store):
        as_async = getattr(store, "as_async", None)
        if callable(as_async):
            face: AsyncStore = as_async()
            return face
        return InlineAsyncStore(store)
    raise ConfigurationError(f"not a store or store URL: {store!r}")


def resolve_store(store: str | Store) -> Store:
    """Accept a URL, a synchronous store, or a store that names its synchronous face.

    An object with an ``as_sync()`` method (an instrumented async store: metrics, spans) gets
    the face it names, as :func:`resolve_async_store` asks for ``as_async()``.

    Raises:
        ConfigurationError: the object is not a synchronous store.
    """
    if isinstance(store, str):
        return store_from_url(store)
    as_sync = getattr(store, "as_sync", None)
    if callable(as_sync):
        face: Store = as_sync()
        return face
    if isinstance(store, Store) and not hasattr(store, "aclose"):
        return store
    raise ConfigurationError(f"not a synchronous store or store URL: {store!r}")
