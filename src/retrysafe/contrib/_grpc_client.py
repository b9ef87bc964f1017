"""The client side of :mod:`retrysafe.contrib.grpc`: interceptors that give each logical unary
call one ``idempotency-key`` and keep it across gRPC's retries and the caller's own (public names
are re-exported there)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import grpc
import grpc.aio

from .._core.errors import ConfigurationError
from .._core.rpc import KEY
from ..client._journal import current_operation
from ..client._rpc import resend_delay

__all__ = [
    "AsyncIdempotencyKeyInterceptor",
    "IdempotencyKeyInterceptor",
    "call_key",
    "method_names",
]


def method_names(names: Iterable[str], owner: str, option: str) -> list[str]:
    """The full method names an option lists, checked (``/package.Service/Method``)."""
    if isinstance(names, str):
        names = [names]
    found = list(names)
    for name in found:
        if not (isinstance(name, str) and name.startswith("/") and name.count("/") == 2):
            raise ConfigurationError(
                f"{owner}({option}=...): full method names ('/package.Service/Method'), "
                f"got {name!r}"
            )
    return found


_call_key: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "retrysafe_grpc_call_key", default=None
)


@contextlib.contextmanager
def call_key(key: str | None = None) -> Iterator[str]:
    """Send every intercepted call inside the block with one key: the caller's own retries of
    one logical call. For a key that survives a crash of the client, use the journal instead:
    ``with journal.operation("checkout-42"):`` (:class:`~retrysafe.client.SQLiteJournal`).

    Args:
        key: the key (default: a new random one).

    Yields:
        The key.
    """
    chosen = key or str(uuid.uuid4())
    token = _call_key.set(chosen)
    try:
        yield chosen
    finally:
        _call_key.reset(token)


class _CallDetails(
    collections.namedtuple(
        "_CallDetails",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,
):
    """A call's details with the key added (grpc's own class is private)."""


def _keyed_metadata(metadata: Any) -> tuple[tuple[tuple[str, Any], ...], str | None, Any]:
    """The metadata with a key (kept when the caller set one), the key, and the journal
    operation the key comes from (``None`` when not a journal's)."""
    pairs = tuple(metadata or ())
    for name, value in pairs:
        if name == KEY:
            return pairs, str(value), None
    operation = current_operation()
    key = _call_key.get()
    if key is None and operation is not None:
        key = operation.key
    else:
        operation = None
    if key is None:
        key = str(uuid.uuid4())
    return (*pairs, (KEY, key)), key, operation


class _ClientSettings:
    def __init__(self, owner: str, methods: Iterable[str] | None, retries: int) -> None:
        self.methods = (
            None if methods is None else frozenset(method_names(methods, owner, "methods"))
        )
        if not isinstance(retries, int) or retries < 0:
            raise ConfigurationError(f"{owner}(retries=...): must be 0 or more, got {retries!r}")
        self.retries = retries

    def covers(self, method: Any) -> bool:
        name = method.decode() if isinstance(method, bytes) else method
        return self.methods is None or name in self.methods


class IdempotencyKeyInterceptor(grpc.UnaryUnaryClientInterceptor):
    """Gives each logical unary call one ``idempotency-key`` and resends it safely.

    The key goes into the call's metadata once, so gRPC's own retries (a channel's
    ``retryPolicy``, transparent retries) resend it unchanged; this interceptor resends the
    same call with the same key after ``UNAVAILABLE`` (the server went away: the call may or may
    not have run) and ``ABORTED`` (the first call with the key still runs), waiting as the
    server's ``grpc-retry-pushback-ms``/``retry-after`` says. A key the caller set is kept; inside
    ``with journal.operation(...)`` the journal's key is used, so a client that crashes and runs
    again sends the same key; inside ``with call_key():`` one key spans the caller's own
    retries.

    Args:
        methods: the full method names that get a key (default: every unary-unary method).
        retries: resends after ``UNAVAILABLE``/``ABORTED`` (0: none).

    Raises:
        ConfigurationError: a bad option.
    """

    def __init__(self, *, methods: Iterable[str] | None = None, retries: int = 3) -> None:
        self.settings = _ClientSettings("IdempotencyKeyInterceptor", methods, retries)

    def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        if not self.settings.covers(client_call_details.method):
            return continuation(client_call_details, request)
        metadata, _, operation = _keyed_metadata(client_call_details.metadata)
        details = _CallDetails(
            client_call_details.method,
            client_call_details.timeout,
            metadata,
            client_call_details.credentials,
            getattr(client_call_details, "wait_for_ready", None),
            getattr(client_call_details, "compression", None),
        )
        attempt = 0
        while True:
            attempt += 1
            outcome = continuation(details, request)
            code = outcome.code()
            delay = resend_delay(
                code.name, outcome.trailing_metadata() or (), attempt, self.settings.retries
            )
            if delay is None:
                if operation is not None:
                    operation.finish(code.value[0])
                return outcome
            time.sleep(delay)


class AsyncIdempotencyKeyInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    """:class:`IdempotencyKeyInterceptor` for ``grpc.aio`` channels.

    Args:
        methods: see :class:`IdempotencyKeyInterceptor`.
        retries: see :class:`IdempotencyKeyInterceptor`.
    """

    def __init__(self, *, methods: Iterable[str] | None = None, retries: int = 3) -> None:
        self.settings = _ClientSettings("AsyncIdempotencyKeyInterceptor", methods, retries)

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        if not self.settings.covers(client_call_details.method):
            return await continuation(client_call_details, request)
        metadata, _, operation = _keyed_metadata(client_call_details.metadata)
        details = client_call_details._replace(metadata=grpc.aio.Metadata(*metadata))
        attempt = 0
        while True:
            attempt += 1
            call = await continuation(details, request)
            code = await call.code()
            trailing = await call.trailing_metadata()
            delay = resend_delay(code.name, tuple(trailing or ()), attempt, self.settings.retries)
            if delay is None:
                if operation is not None:
                    operation.finish(code.value[0])
                return call
            await asyncio.sleep(delay)
