"""The Django middleware: a thin shell over the request flow, sync and async.

Django calls it in the mode of its stack: under WSGI it drives the sync runner
(:class:`~retrysafe._sync.runner.Exchange`), under ASGI the async one
(:class:`~retrysafe._async.runner.AsyncExchange`), with no thread hop per request. The work is
split the way Django splits a request:

- ``process_view`` (the view, hence its ``@idempotent`` marks, is known): admission, the body,
  the claim; a replay or a problem answer is returned from here and the view never runs. In
  transactional mode the view's ``transaction.atomic()`` block is entered here.
- ``__call__``, once the inner middleware and the view have answered: the response is captured
  and settled (stored, or the key released), and the atomic block commits with the record.

Every decision is the flow's (:mod:`retrysafe._core.http`); the Django shell only translates.
The translation is plain helpers (:mod:`._shell`), the claim and the settling are
:mod:`._async_view` and its generated sync twin :mod:`._sync_view`, and the middleware's
methods only pick the mode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync, iscoroutinefunction, markcoroutinefunction
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse

from ..._async.runner import AsyncExchange, AsyncRunner
from ..._core.config import IdempotencyConfig, RouteOptions, front_config
from ..._core.errors import ConfigurationError
from ..._core.http import Answer, admit, notify
from ..._core.routes import route_config, route_options
from ..._core.transaction import CONTEXT_SCOPE_KEY, context_transaction
from ..._sync.runner import Runner
from ...stores import AsyncStore, Store, resolve_async_store, resolve_store
from . import _async_view, _sync_view
from ._shell import EXCHANGE_ATTR, Admitted, neutral_request, read_body, to_response
from .conf import load_settings

__all__ = [
    "IdempotencyMiddleware",
    "amark_committed",
    "async_store",
    "atransaction",
    "mark_committed",
    "sync_store",
    "transaction",
    "view_options",
]


def sync_store(store: Any) -> Store:
    """The synchronous store ``settings.RETRYSAFE["STORE"]`` names (``"django"`` and
    ``"django://<alias>"`` too: the store registry resolves them like any store URL).

    Raises:
        ConfigurationError: an unknown scheme, a missing extra or database alias.
    """
    return resolve_store(store)


def async_store(store: Any) -> AsyncStore:
    """The async store ``settings.RETRYSAFE["STORE"]`` names (ASGI deployments)."""
    return resolve_async_store(store)


def view_options(view_func: Any, method: str) -> RouteOptions | None:
    """The ``@idempotent`` marks of the view a request goes to: on the handler method of a
    class-based view or DRF action (``post``, ``create``), else on the class, else on the view
    function."""
    cls = getattr(view_func, "cls", None) or getattr(view_func, "view_class", None)
    if cls is not None:
        actions = getattr(view_func, "actions", None)  # DRF ViewSet.as_view({"post": "create"})
        name = actions.get(method.lower()) if isinstance(actions, dict) else method.lower()
        handler = getattr(cls, name, None) if name else None
        found = route_options(handler) if handler is not None else None
        if found is None:
            found = route_options(cls)
        if found is not None:
            return found
    return route_options(view_func)


def mark_committed(request: HttpRequest) -> bool:
    """Declare the view's side effects committed (non-transactional mode); see
    :func:`retrysafe.mark_committed`. Sync views only; async views use
    :func:`amark_committed`.

    Returns:
        ``True`` when recorded (or the request has no key); ``False`` when the store could not
        be reached or the lease was lost.
    """
    exchange = getattr(request, EXCHANGE_ATTR, None)
    if exchange is None:
        return True
    if isinstance(exchange, AsyncExchange):  # a sync view on an ASGI stack
        return bool(async_to_sync(exchange.mark_committed)())
    return bool(exchange.mark_committed())


async def amark_committed(request: HttpRequest) -> bool:
    """The async twin of :func:`mark_committed`."""
    exchange = getattr(request, EXCHANGE_ATTR, None)
    return True if exchange is None else bool(await exchange.mark_committed())


def transaction(request: HttpRequest, *, optional: bool = False) -> Any:
    """The connection of the request's transaction with a SQL URL store in transactional mode
    (``sqlite3.Connection``, ``psycopg.Connection``): the view's writes on it commit with the
    stored response. (With the ``django`` store the view simply uses the ORM.) Sync stack; see
    :func:`atransaction` for ASGI.

    Raises:
        ConfigurationError: the request has no such transaction and ``optional`` is false.
    """
    exchange = getattr(request, EXCHANGE_ATTR, None)
    tx = context_transaction({CONTEXT_SCOPE_KEY: exchange}, optional=optional)
    if tx is None:
        return None
    if isinstance(exchange, AsyncExchange):  # a sync view on an ASGI stack
        return async_to_sync(tx.connection)()
    return tx.connection()


async def atransaction(request: HttpRequest, *, optional: bool = False) -> Any:
    """The async twin of :func:`transaction` (``asyncpg`` or ``sqlite3`` connection)."""
    tx = context_transaction({CONTEXT_SCOPE_KEY: getattr(request, EXCHANGE_ATTR, None)},
                             optional=optional)  # fmt: skip
    return None if tx is None else await tx.connection()


class IdempotencyMiddleware:
    """Makes POST/PATCH requests that carry an ``Idempotency-Key`` safe to retry (Django).

    Add ``"retrysafe.contrib.django.IdempotencyMiddleware"`` to ``MIDDLEWARE`` after the
    authentication middleware (the principal is ``request.user``) and after
    ``CsrfViewMiddleware``; settings come from ``settings.RETRYSAFE``.

    Args:
        get_response: the next handler (Django passes it).

    Raises:
        ImproperlyConfigured: bad settings (at start-up, never per request).
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        try:
            settings = load_settings()
            if self.is_async:
                self.store: Any = async_store(settings.store)
                self._arunner = AsyncRunner(self.store)
            else:
                self.store = sync_store(settings.store)
                self._runner = Runner(self.store)
            self.config = front_config(settings.config, {}, self.store)
        except ConfigurationError as exc:
            raise ImproperlyConfigured(str(exc)) from exc
        self._configs: dict[int, IdempotencyConfig] = {}
        if self.is_async:
            markcoroutinefunction(self)
            # Django adapts process_view to the stack's mode by its type: give it a coroutine.
            self.process_view = self._aprocess_view  # type: ignore[method-assign]

    # -- before the view ---------------------------------------------------------------------

    def process_view(
        self, request: HttpRequest, view_func: Any, view_args: Any, view_kwargs: Any
    ) -> HttpResponse | None:
        """Claim the key before the view runs (sync stack)."""
        admitted = self._admit(request, view_func)
        if admitted is None or isinstance(admitted, HttpResponse):
            return admitted
        return _sync_view.claim(self._runner, request, admitted)

    async def _aprocess_view(
        self, request: HttpRequest, view_func: Any, view_args: Any, view_kwargs: Any
    ) -> HttpResponse | None:
        """Claim the key before the view runs (async stack)."""
        admitted = self._admit(request, view_func)
        if admitted is None or isinstance(admitted, HttpResponse):
            return admitted
        return await _async_view.claim(self._arunner, request, admitted)

    def _admit(self, request: HttpRequest, view_func: Any) -> Admitted | HttpResponse | None:
        """Admission and the body; ``None``: run the view unprotected."""
        base = self.config
        if request.method not in base.methods:
            return None
        config = route_config(self._configs, view_options(view_func, request.method or ""), base)
        if config is None:  # the view opted out
            return None
        neutral = neutral_request(request)
        admitted = admit(neutral, config)
        if admitted is None:
            return None
        if not isinstance(admitted, Answer):
            body = read_body(request, neutral.content_length, config)
            if isinstance(body, bytes):
                return config, neutral, admitted, body
            admitted = body
        notify(config, admitted.event or "", neutral, "")
        return to_response(admitted)

    # -- around the view ---------------------------------------------------------------------

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        return _sync_view.respond(self.get_response, request)

    async def __acall__(self, request: HttpRequest) -> Any:
        return await _async_view.respond(self.get_response, request)
