# Generated from src/retrysafe/contrib/django/_async_view.py by scripts/unasync.py: do not edit.
"""The Django middleware's steps around the view on a WSGI stack: claim, then settle.

This file is generated from ``_async_view.py`` by ``scripts/unasync.py``
(``make lint`` checks it is up to date): edit that file, then run the script. What genuinely
differs between the two modes lives in the hand-written pairs of :mod:`._shell` (the user, the
capture of a streamed body).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse

from ..._core.errors import StoreError
from ..._core.http import EXECUTE, RUN_UNPROTECTED, Answer, Capture, Flow
from ..._sync.runner import Exchange, Runner
from ._shell import (
    EXCHANGE_ATTR,
    Admitted,
    capture_response,
    request_user,
    response_head,
    to_response,
    with_added,
)
from .store import DjangoTransaction, current_route

__all__ = ["claim", "respond"]


def claim(runner: Runner, request: HttpRequest, admitted: Admitted) -> HttpResponse | None:
    """Claim the key before the view runs.

    Returns:
        The response that ends the request here (a replay, a problem answer), or ``None``: run
        the view (protected, its exchange left on the request; or unprotected, failing open).
    """
    config, neutral, key, body = admitted
    neutral.user = request_user(request)
    exchange = Exchange(runner, Flow(config, neutral, key, body))
    label = current_route.set(f"{neutral.method} {neutral.route or neutral.path}")
    try:
        verdict = exchange.claim()
    finally:
        current_route.reset(label)
    if verdict is RUN_UNPROTECTED:
        return None
    if verdict is not EXECUTE:
        assert isinstance(verdict, Answer)
        return to_response(verdict)
    if isinstance(exchange.transaction, DjangoTransaction):
        # The view's ORM writes must land in the block: enter it before the view runs (a URL
        # store's transaction begins lazily, when the view asks for it).
        try:
            exchange.transaction.connection()
        except StoreError as exc:
            failed = _fail(exchange, exc, False)
            assert failed is not None  # a store error is always answered (503)
            return failed
    exchange.start()
    setattr(request, EXCHANGE_ATTR, exchange)
    return None


def respond(get_response: Callable[[HttpRequest], Any], request: HttpRequest) -> Any:
    """Run the rest of the stack and the view; settle a protected request with its response
    (stored, or the key released) and answer with it or with the flow's answer."""
    try:
        response = get_response(request)
    except BaseException as exc:
        exchange = request.__dict__.pop(EXCHANGE_ATTR, None)
        failed = None if exchange is None else _fail(exchange, exc, False)
        if failed is None:
            raise
        return failed
    exchange = request.__dict__.pop(EXCHANGE_ATTR, None)
    if exchange is None:
        return response
    status, headers = response_head(response)
    capture = Capture(exchange.flow.config.max_stored_body_size)
    try:
        capture_response(response, capture)
    except BaseException as exc:
        failed = _fail(exchange, exc, True)
        if failed is None:
            raise
        return failed
    try:
        answer = exchange.settle(status, headers, capture.body, capture.omitted)
    finally:
        exchange.end()
    return with_added(response, exchange) if answer is None else to_response(answer)


def _fail(exchange: Exchange, exc: BaseException, started: bool) -> HttpResponse | None:
    """The flow's answer to a failure of the view (the key released, or outcome unknown);
    ``None``: let the exception propagate."""
    try:
        answer = exchange.fail(exc, started)
    finally:
        exchange.end()
    return None if answer is None else to_response(answer)
