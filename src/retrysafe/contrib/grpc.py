"""gRPC server interceptors: a unary call with an ``idempotency-key`` runs once per key.

::

    import grpc
    from retrysafe.contrib.grpc import IdempotencyInterceptor

    server = grpc.server(
        executor, interceptors=[IdempotencyInterceptor(store="sqlite:///idempotency.db")]
    )

and :class:`AsyncIdempotencyInterceptor` for ``grpc.aio.server(interceptors=[...])``.

The first call with a key runs and its outcome is stored: the serialized response, the status
code and details, and the trailing metadata. A repeat gets the same outcome, the same response
bytes, with ``idempotency-replayed: true`` in its trailing metadata; nothing runs. The same key
while the first call runs: ``ABORTED`` with ``retry-after`` (and ``grpc-retry-pushback-ms``, which
gRPC's own retry policy honours), or, with ``on_conflict="wait"``, the first call's outcome.
The same key with another method or request message: ``INVALID_ARGUMENT``. Which codes are
stored and which free the key: :data:`~retrysafe._core.rpc.DEFAULT_RELEASE_CODES`. A key on a
streaming method is refused (``INVALID_ARGUMENT``, nothing runs); without one it runs as usual.

The interceptors are shells: they translate gRPC's handler and context to the flow of
:mod:`retrysafe._core.rpc` and back. The two are written by hand, not generated: the sync one
runs in the server's worker thread, the aio one shields the handler in a task of its own so a
cancelled call still stores its outcome.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from .._async.runner import AsyncOperationRun, AsyncRunner
from .._core.config import IdempotencyConfig, front_config, front_store
from .._core.drive import drive as adrive
from .._core.drive_sync import drive
from .._core.errors import ConfigurationError
from .._core.events import LOG_LEVELS
from .._core.operation import EXECUTE, RUN_UNPROTECTED, report
from .._core.options import ConfigSource
from .._core.rpc import (
    DEFAULT_RELEASE_CODES,
    KEY,
    REPLAYED,
    Metadata,
    PrincipalResolver,
    RpcAnswer,
    RpcFlow,
    admit_rpc,
    metadata_principal,
)
from .._core.transaction import CURRENT_CALL
from .._sync.runner import OperationRun, Runner
from ..stores import AsyncStore, Store, resolve_async_store, resolve_store
from ._extra import extra

with extra("grpc"):
    import grpc
    import grpc.aio

    from ._grpc_client import (
        AsyncIdempotencyKeyInterceptor,
        IdempotencyKeyInterceptor,
        call_key,
        method_names,
    )

__all__ = [
    "KEY",
    "REPLAYED",
    "AsyncIdempotencyInterceptor",
    "AsyncIdempotencyKeyInterceptor",
    "IdempotencyInterceptor",
    "IdempotencyKeyInterceptor",
    "call_key",
]

#: A method handler (``grpc.RpcMethodHandler``; its behaviours are typed per kind).
Handler = Any

_CODES = {code.name: code for code in grpc.StatusCode}

#: Calls whose handler outlives their cancelled call (aio); kept so they are not collected.
_detached: set[asyncio.Future[Any]] = set()


def _forget(task: asyncio.Future[Any]) -> None:
    _detached.discard(task)
    if not task.cancelled() and (error := task.exception()) is not None:
        logging.getLogger("retrysafe").error("detached handler failed", exc_info=error)


#: Fields of IdempotencyConfig that only an HTTP front reads: refused here rather than ignored.
_HTTP_ONLY = frozenset(
    {
        "max_body_size",
        "max_stored_body_size",
        "canonical_json",
        "release_statuses",
        "store_server_errors",
        "replay_header_denylist",
        "replay_header_allowlist",
        "scope_resolver",
        "problem_type_base",
        "documentation_url",
        "detach_handler",
        "replay_headers",
        "retention_header",
    }
)


class _Settings:
    """What both interceptors take, checked once at construction."""

    def __init__(
        self,
        owner: str,
        config: IdempotencyConfig | None,
        store: object,
        methods: Iterable[str] | None,
        required_methods: Iterable[str],
        principal: str | PrincipalResolver | None,
        release_codes: Iterable[str] | None,
        options: dict[str, Any],
    ) -> None:
        source = ConfigSource.keywords(owner)
        for name in sorted(_HTTP_ONLY.intersection(options)):
            hint = " (use principal=)" if name == "scope_resolver" else ""
            hint = " (use release_codes=)" if name == "release_statuses" else hint
            raise ConfigurationError(
                f"{owner}({name}=...): an HTTP option, it does not apply to gRPC calls{hint}",
                option=name,
            )
        self.config = front_config(config, options, store, source)
        self.methods = (
            None if methods is None else frozenset(method_names(methods, owner, "methods"))
        )
        self.required = frozenset(method_names(required_methods, owner, "required_methods"))
        if principal is None:
            self.principal: PrincipalResolver | None = None
        elif isinstance(principal, str):
            self.principal = metadata_principal(principal)
        elif callable(principal):
            self.principal = principal
        else:
            raise ConfigurationError(
                f"{owner}(principal=...): must be a metadata key or a callable, got {principal!r}"
            )
        codes = DEFAULT_RELEASE_CODES if release_codes is None else frozenset(release_codes)
        unknown = sorted(codes - set(_CODES) - {code.name for code in grpc.StatusCode})
        if unknown or "OK" in codes:
            raise ConfigurationError(
                f"{owner}(release_codes=...): not status codes that can be released: "
                f"{', '.join(unknown or ['OK'])}"
            )
        self.release_codes = codes

    def covers(self, method: str) -> bool:
        return self.methods is None or method in self.methods

    def admit(self, method: str, metadata: Metadata, unary: bool) -> str | RpcAnswer | None:
        required = self.config.required or method in self.required
        admitted = admit_rpc(metadata, unary=unary, required=required)
        if isinstance(admitted, RpcAnswer) and admitted.event is not None:
            event = admitted.event
            if self.config.on_event is not None or event in LOG_LEVELS:
                report(self.config, event, {"record": None, "method": "RPC", "route": method})
        return admitted

    def flow(self, method: str, key: str, request: bytes, metadata: Metadata) -> RpcFlow:
        principal = "" if self.principal is None else self.principal(metadata)
        return RpcFlow(self.config, method, key, request, principal, self.release_codes)


def _metadata(details: Any) -> Metadata:
    return tuple(details.invocation_metadata or ())


def _code(context: Any) -> str | None:
    code = context.code()
    if code is None:
        return None
    if isinstance(code, grpc.StatusCode):
        return code.name
    return _by_number(int(code))


def _by_number(number: int) -> str:
    for code in grpc.StatusCode:
        if code.value[0] == number:
            return code.name
    return "UNKNOWN"


def _details(context: Any) -> str:
    details = context.details()
    if isinstance(details, bytes):
        return details.decode("utf-8", "replace")
    return details or ""


def _trailing(context: Any) -> Metadata:
    return tuple(context.trailing_metadata() or ())


def _identity(data: bytes) -> bytes:
    return data


def _serialize(handler: Handler, response: Any) -> bytes:
    serializer = handler.response_serializer
    data: bytes = response if serializer is None else serializer(response)
    return data


def _deserialize(handler: Handler, request: bytes) -> Any:
    deserializer = handler.request_deserializer
    return request if deserializer is None else deserializer(request)


def _refusing(handler: Handler, answer: RpcAnswer, *, aio: bool) -> Handler:
    """A handler of the same kind as ``handler`` that ends every call with ``answer`` (its
    request, or request stream, unread)."""
    code, details = _CODES[answer.code], answer.details

    def refuse(request: Any, context: Any) -> Any:
        context.abort(code, details)

    async def arefuse(request: Any, context: Any) -> Any:
        await context.abort(code, details)

    kinds = {
        "unary_unary": grpc.unary_unary_rpc_method_handler,
        "unary_stream": grpc.unary_stream_rpc_method_handler,
        "stream_unary": grpc.stream_unary_rpc_method_handler,
        "stream_stream": grpc.stream_stream_rpc_method_handler,
    }
    for kind, make in kinds.items():
        if getattr(handler, kind) is not None:
            return make(
                arefuse if aio else refuse,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    return handler  # pragma: no cover - a handler has one kind


class IdempotencyInterceptor(grpc.ServerInterceptor):
    """Makes unary-unary calls that carry ``idempotency-key`` metadata safe to retry, on a
    ``grpc.server``.

    Args:
        store: a store URL (``"sqlite:///idempotency.db"``, ``"redis://..."``) or a store.
        config: the settings; or pass them as keyword arguments instead.
        methods: the full method names protected (``"/shop.Orders/Create"``); default every
            unary-unary method (a call without a key runs unprotected).
        required_methods: methods whose calls must carry a key (else ``INVALID_ARGUMENT``);
            ``required=True`` requires it everywhere.
        principal: whom a key belongs to: a metadata key whose value is hashed (default
            ``"authorization"``), a callable given the invocation metadata, or ``None``
            (global keys).
        release_codes: status code names that free the key instead of being stored (default
            :data:`~retrysafe._core.rpc.DEFAULT_RELEASE_CODES`).
        **options: fields of :class:`~retrysafe.IdempotencyConfig` (``ttl``, ``lease``,
            ``on_conflict``, ``transactional``, ``on_event``...).

    Raises:
        ConfigurationError: a bad store or option, naming it (at construction).
    """

    def __init__(
        self,
        *,
        store: str | Store,
        config: IdempotencyConfig | None = None,
        methods: Iterable[str] | None = None,
        required_methods: Iterable[str] = (),
        principal: str | PrincipalResolver | None = "authorization",
        release_codes: Iterable[str] | None = None,
        **options: Any,
    ) -> None:
        owner = "IdempotencyInterceptor"
        self.store = front_store(resolve_store, store, ConfigSource.keywords(owner))
        self.settings = _Settings(
            owner, config, self.store, methods, required_methods, principal, release_codes, options
        )
        self._runner = Runner(self.store)

    def close(self) -> None:
        """Close the store."""
        self.store.close()

    def intercept_service(
        self,
        continuation: Callable[[Any], Handler | None],
        handler_call_details: Any,
    ) -> Handler | None:
        handler = continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or not self.settings.covers(method):
            return handler
        metadata = _metadata(handler_call_details)
        unary = handler.unary_unary is not None
        admitted = self.settings.admit(method, metadata, unary)
        if admitted is None:
            return handler
        if isinstance(admitted, RpcAnswer):
            return _refusing(handler, admitted, aio=False)
        key = admitted

        def behavior(request: bytes, context: Any) -> bytes | None:
            return self._call(handler, method, key, metadata, request, context)

        return grpc.unary_unary_rpc_method_handler(
            behavior, request_deserializer=_identity, response_serializer=_identity
        )

    def _call(
        self,
        handler: Handler,
        method: str,
        key: str,
        metadata: Metadata,
        request: bytes,
        context: Any,
    ) -> bytes | None:
        flow = self.settings.flow(method, key, request, metadata)
        run: OperationRun[RpcAnswer, RpcFlow] = OperationRun(self._runner, flow)
        verdict = run.claim()
        if verdict is RUN_UNPROTECTED:
            return _serialize(handler, handler.unary_unary(_deserialize(handler, request), context))
        if verdict is not EXECUTE:
            assert isinstance(verdict, RpcAnswer)
            return _end(context, verdict)
        token = CURRENT_CALL.set(run)
        run.start()
        try:
            try:
                response = handler.unary_unary(_deserialize(handler, request), context)
            except Exception as exc:
                code = _code(context)
                run.keeper.discard(run)
                if code is None or code == "OK":  # an unexpected error: gRPC answers UNKNOWN
                    answer = drive(flow.failed(exc), run)
                else:  # context.abort(): the handler's own outcome
                    answer = drive(
                        flow.settle(code, _details(context), None, _trailing(context)), run
                    )
                if answer is not None:
                    return _end(context, answer)
                raise
            code = _code(context) or "OK"
            data = _serialize(handler, response) if code == "OK" and response is not None else None
            flow.observe(run.keeper.discard(run) - run.started)
            answer = drive(flow.settle(code, _details(context), data, _trailing(context)), run)
            if answer is not None:
                return _end(context, answer)
            return data
        finally:
            CURRENT_CALL.reset(token)
            run.end()


def _end(context: Any, answer: RpcAnswer) -> bytes | None:
    """End the call with the flow's answer (a replay, or a refusal)."""
    if answer.trailing:
        context.set_trailing_metadata(tuple(answer.trailing))
    if answer.code == "OK":
        return answer.response
    context.abort(_CODES[answer.code], answer.details)
    raise AssertionError("unreachable: abort raises")  # pragma: no cover


class AsyncIdempotencyInterceptor(grpc.aio.ServerInterceptor):
    """:class:`IdempotencyInterceptor` for ``grpc.aio.server`` (async servicers).

    Args:
        store: a store URL or an async store (or a local sync one: memory, SQLite).
        config: the settings; or pass them as keyword arguments instead.
        methods: see :class:`IdempotencyInterceptor`.
        required_methods: see :class:`IdempotencyInterceptor`.
        principal: see :class:`IdempotencyInterceptor`.
        release_codes: see :class:`IdempotencyInterceptor`.
        **options: fields of :class:`~retrysafe.IdempotencyConfig`.

    Raises:
        ConfigurationError: a bad store or option, naming it (at construction).
    """

    def __init__(
        self,
        *,
        store: str | AsyncStore | Store,
        config: IdempotencyConfig | None = None,
        methods: Iterable[str] | None = None,
        required_methods: Iterable[str] = (),
        principal: str | PrincipalResolver | None = "authorization",
        release_codes: Iterable[str] | None = None,
        **options: Any,
    ) -> None:
        owner = "AsyncIdempotencyInterceptor"
        self.store = front_store(resolve_async_store, store, ConfigSource.keywords(owner))
        self.settings = _Settings(
            owner, config, self.store, methods, required_methods, principal, release_codes, options
        )
        self._runner = AsyncRunner(self.store)

    async def aclose(self) -> None:
        """Close the store."""
        await self.store.aclose()

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Handler]],
        handler_call_details: Any,
    ) -> Handler:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or not self.settings.covers(method):
            return handler
        metadata = _metadata(handler_call_details)
        admitted = self.settings.admit(method, metadata, handler.unary_unary is not None)
        if admitted is None:
            return handler
        if isinstance(admitted, RpcAnswer):
            return _refusing(handler, admitted, aio=True)
        key = admitted

        async def behavior(request: bytes, context: Any) -> Any:
            flow = self.settings.flow(method, key, request, metadata)
            run: AsyncOperationRun[RpcAnswer, RpcFlow] = AsyncOperationRun(self._runner, flow)
            verdict = await run.claim()
            if verdict is RUN_UNPROTECTED:
                response = await handler.unary_unary(_deserialize(handler, request), context)
                return _serialize(handler, response)
            if verdict is not EXECUTE:
                assert isinstance(verdict, RpcAnswer)
                return await _aend(context, verdict)
            # The handler runs in a task of its own: a cancelled call (its client went away)
            # does not cancel it, and its outcome is still stored.
            task = asyncio.ensure_future(_aexecute(handler, run, request, context))
            try:
                answer, data = await asyncio.shield(task)
            except asyncio.CancelledError:
                if not task.done():
                    _detached.add(task)
                    task.add_done_callback(_forget)
                raise
            if answer is not None:
                return await _aend(context, answer)
            return data

        return grpc.unary_unary_rpc_method_handler(
            behavior, request_deserializer=_identity, response_serializer=_identity
        )


async def _aexecute(
    handler: Handler,
    run: AsyncOperationRun[RpcAnswer, RpcFlow],
    request: bytes,
    context: Any,
) -> tuple[RpcAnswer | None, bytes | None]:
    """Run the handler once for the won key and settle its outcome."""
    flow = run.flow
    assert isinstance(flow, RpcFlow)
    token = CURRENT_CALL.set(run)
    run.start()
    try:
        try:
            response = await handler.unary_unary(_deserialize(handler, request), context)
        except Exception as exc:
            code = _code(context)
            run.keeper.discard(run)
            if code is None or code == "OK":
                answer = await adrive(flow.failed(exc), run)
            else:
                steps = flow.settle(code, _details(context), None, _trailing(context))
                answer = await adrive(steps, run)
            if answer is not None:
                return answer, None
            raise
        code = _code(context) or "OK"
        data = _serialize(handler, response) if code == "OK" and response is not None else None
        flow.observe(run.keeper.discard(run) - run.started)
        steps = flow.settle(code, _details(context), data, _trailing(context))
        return await adrive(steps, run), data
    finally:
        CURRENT_CALL.reset(token)
        await run.end()


async def _aend(context: Any, answer: RpcAnswer) -> bytes | None:
    if answer.trailing:
        context.set_trailing_metadata(tuple(answer.trailing))
    if answer.code == "OK":
        return answer.response
    await context.abort(_CODES[answer.code], answer.details)
    raise AssertionError("unreachable: abort raises")  # pragma: no cover
