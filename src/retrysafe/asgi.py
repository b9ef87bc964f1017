"""Pure ASGI idempotency middleware (no Starlette import needed).

Works in any ASGI app: Starlette, FastAPI, Litestar, or a bare ASGI callable::

    app = IdempotencyMiddleware(app, store="sqlite:///idempotency.db")

Per-request state lives in a :class:`_Exchange` object; the middleware itself keeps only its
configuration, store and route cache.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ._codec import StoredResponse, decode_response, encode_response
from ._config import IdempotencyConfig, RouteOptions
from ._core import Decision, decide, retry_after
from ._errors import CodecError, ConfigurationError, InvalidKeyError, StoreError
from ._fingerprint import fingerprint
from ._keys import parse_key, record_id
from ._logging import LOG_LEVELS, log_event
from ._problems import render_problem
from ._routes import RouteTable
from ._scope import authorization_scope, user_scope
from ._transaction import CONTEXT_SCOPE_KEY, AsyncTransaction
from .stores import AsyncStore, Store, resolve_async_store
from .stores._base import Reservation

__all__ = ["IdempotencyMiddleware"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Any, Receive, Send], Awaitable[None]]

logger = logging.getLogger("retrysafe")

_REPLAYED = (b"idempotency-replayed", b"true")
_BODY_OMITTED = (b"idempotency-body-omitted", b"true")


#: Handlers that outlive their cancelled request; kept here so they are not garbage-collected.
_detached: set[asyncio.Future[None]] = set()
#: Background completions after a store failure (kept referenced until they end).
_pending: set[asyncio.Future[None]] = set()
#: How long a response whose completion failed is retried before giving up.
_COMPLETION_RETRY_SECONDS = 120.0


def _keep(task: asyncio.Future[None]) -> None:
    _pending.add(task)
    task.add_done_callback(_pending.discard)


def _forget(task: asyncio.Future[None]) -> None:
    _detached.discard(task)
    if not task.cancelled() and task.exception() is not None:
        # The key was released; the client that could see the error is gone.
        logger.error("handler of a cancelled request failed", exc_info=task.exception())


class _RequestTooLarge(Exception):
    pass


class _ClientGone(Exception):
    pass


def _route_template(scope: Scope) -> str | None:
    """The template of the route a request goes to (``/orders/{id}``), for metric labels.

    Starlette and FastAPI put the matched route in ``scope["route"]`` once routed; before that
    (a replay never reaches the router) the app's routes are matched here. ``None`` when
    unknown: labels must never carry the raw path (unbounded cardinality).
    """
    route = scope.get("route")
    if route is not None:
        template = getattr(route, "path_format", None) or getattr(route, "path", None)
        return template if isinstance(template, str) else None
    app = scope.get("app")
    routes = getattr(app, "routes", None)
    if not routes:
        return None
    # Matching every route costs about a microsecond each: remember the answer per path.
    try:
        templates = _templates.get(app)
        if templates is None:
            templates = _templates[app] = {}
    except TypeError:  # an app that cannot be weakly referenced: no cache
        templates = {}
    cache_key = (len(routes), scope.get("method"), scope.get("path"))
    if cache_key in templates:
        return templates[cache_key]
    found: str | None = None
    for candidate in routes:
        # A Mount's own path is only a prefix of its routes' templates: not a label.
        if getattr(candidate, "routes", None) or not hasattr(candidate, "matches"):
            continue
        try:
            match, _ = candidate.matches(scope)
        except Exception:
            continue
        if getattr(match, "value", 0) == 2:  # starlette.routing.Match.FULL
            template = getattr(candidate, "path_format", None) or getattr(candidate, "path", None)
            found = template if isinstance(template, str) else None
            break
    if len(templates) >= _TEMPLATES_MAX:
        templates.clear()  # raw paths with ids in them must not grow it without bound
    templates[cache_key] = found
    return found


#: app -> ``(route count, method, path)`` -> route template, for :func:`_route_template`.
_templates: weakref.WeakKeyDictionary[Any, dict[tuple[int, object, object], str | None]] = (
    weakref.WeakKeyDictionary()
)
_TEMPLATES_MAX = 4096


class IdempotencyMiddleware:
    """Makes POST/PATCH requests that carry an ``Idempotency-Key`` safe to retry.

    Args:
        app: the ASGI app to protect.
        store: a store URL (``"sqlite:///idempotency.db"``, ``"redis://..."``), an async store,
            or a local synchronous store (memory, SQLite).
        config: the settings; or pass them as keyword arguments instead.
        **options: fields of :class:`~retrysafe.IdempotencyConfig`.

    Raises:
        ConfigurationError: bad settings or store (at construction, never per request).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: str | AsyncStore | Store,
        config: IdempotencyConfig | None = None,
        **options: Any,
    ) -> None:
        if config is not None and options:
            raise ConfigurationError("pass either config= or keyword options, not both")
        self.app = app
        self.config = config if config is not None else IdempotencyConfig(**options)
        self.store = resolve_async_store(store)
        if self.config.transactional and not callable(getattr(self.store, "begin", None)):
            raise ConfigurationError(
                f"transactional=True needs a SQL store (SQLite or PostgreSQL), not "
                f"{type(self.store).__name__}"
            )
        self._routes = RouteTable()
        # One lease keeper per event loop (a middleware may serve several loops, e.g. in tests).
        self._keepers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LeaseKeeper] = (
            weakref.WeakKeyDictionary()
        )
        self._route_configs: dict[int, IdempotencyConfig] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in self.config.methods:
            await self.app(scope, receive, send)
            return
        options = self._routes.lookup(scope)
        if options is not None and not options.enabled:
            await self.app(scope, receive, send)
            return
        config = self._config_for(options)
        if not config.required:
            # Pass-through without a key is the common case: answer it before any set-up.
            for name, _ in scope["headers"]:
                if name == b"idempotency-key":
                    break
            else:
                await self.app(scope, receive, send)
                return
        await _Exchange(self, config, scope, receive, send).run()

    def _leases(self) -> _LeaseKeeper:
        loop = asyncio.get_running_loop()
        keeper = self._keepers.get(loop)
        if keeper is None:
            keeper = self._keepers[loop] = _LeaseKeeper()
        return keeper

    def _config_for(self, options: RouteOptions | None) -> IdempotencyConfig:
        if options is None:
            return self.config
        config = self._route_configs.get(id(options))
        if config is None:
            config = self.config.with_route(options)
            self._route_configs[id(options)] = config
        return config


class _Exchange:
    """One request through the middleware."""

    __slots__ = (
        "body",
        "client_gone",
        "committed",
        "config",
        "finalizers",
        "lease_lost",
        "mw",
        "receive",
        "record_id",
        "route",
        "scope",
        "send",
        "token",
        "tx",
    )

    def __init__(
        self,
        mw: IdempotencyMiddleware,
        config: IdempotencyConfig,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        self.mw = mw
        self.config = config
        self.scope = scope
        self.receive = receive
        self.send = send
        self.body = b""
        self.record_id = ""
        self.token: str | None = None
        self.client_gone = False
        self.lease_lost = False
        self.committed = False
        self.route: str | bool | None = False  # False: not looked up yet
        self.tx: AsyncTransaction | None = None
        self.finalizers: list[Callable[[bool], Awaitable[None]]] = []

    # -- entry ---------------------------------------------------------------------------------

    async def run(self) -> None:
        config = self.config
        keys: list[bytes] = []
        content_length = -1
        content_type = b""
        authorization = b""
        for name, value in self.scope["headers"]:
            if name == b"idempotency-key":
                keys.append(value)
            elif name == b"content-length":
                try:
                    content_length = int(value)
                except ValueError:
                    content_length = -1
            elif name == b"content-type":
                content_type = value
            elif name == b"authorization":
                authorization = value
        if not keys:
            if config.required:
                self._emit("missing_key")
                await self._problem(
                    "idempotency-key-missing", "This route requires an Idempotency-Key header."
                )
                return
            await self.mw.app(self.scope, self.receive, self.send)
            return
        try:
            key = parse_key(keys)
        except InvalidKeyError as exc:
            self._emit("invalid_key")
            await self._problem("idempotency-key-invalid", exc.reason + ".")
            return
        if content_length > config.max_body_size:
            await self._too_large()
            return
        try:
            self.body = await self._read_body()
        except _RequestTooLarge:
            await self._too_large()
            return
        except _ClientGone:
            return  # the client left before sending its body: nothing ran, nothing to answer
        method: str = self.scope["method"]
        path: str = self.scope["path"]
        fp = fingerprint(
            method,
            path,
            self.scope.get("query_string", b""),
            self.body,
            canonical_json=config.canonical_json,
            content_type=content_type,
        )
        if config.scope_resolver is not None:
            principal = config.scope_resolver(self.scope)
        else:  # asgi_default_scope, with the Authorization header already found above
            principal = user_scope(self.scope.get("user")) or authorization_scope(authorization)
        self.record_id = record_id(principal, method, path, key)
        await self._dispatch(fp)

    async def _dispatch(self, fp: str) -> None:
        config = self.config
        loop = asyncio.get_running_loop()
        deadline = loop.time() + config.conflict_wait
        delay = 0.01
        while True:
            reservation = await self._reserve(fp)
            if reservation is None:
                return
            decision = decide(reservation, fp)
            if decision is Decision.EXECUTE:
                assert reservation.token is not None
                self.token = reservation.token
                self._emit("executed")
                await self._execute()
                return
            record = reservation.record
            assert record is not None
            if decision is Decision.REPLAY:
                assert record.response is not None
                self._emit("replayed")
                await self._replay(record.response)
                return
            if decision is Decision.OUTCOME_UNKNOWN:
                self._emit("outcome_unknown")
                await self._problem(
                    "idempotency-outcome-unknown",
                    "The first request with this Idempotency-Key committed its effects but its "
                    "response was never stored. It will not run again; an operator must resolve "
                    "the key (retrysafe resolve).",
                )
                return
            if decision is Decision.MISMATCH:
                self._emit("mismatch")
                await self._problem(
                    "idempotency-key-reused",
                    "This Idempotency-Key was used with a different request "
                    "(method, path, query or body).",
                )
                return
            if config.on_conflict == "wait" and loop.time() + delay < deadline:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.25)
                continue
            self._emit("conflict")
            await self._problem(
                "idempotency-request-in-progress",
                "The first request with this Idempotency-Key is still being processed; "
                "retry later.",
                retry_after=retry_after(record.lease_remaining),
            )
            return

    async def _reserve(self, fp: str) -> Reservation | None:
        try:
            return await self.mw.store.reserve(
                self.record_id, fp, lease=self.config.lease, ttl=self.config.ttl
            )
        except StoreError as exc:
            if self.config.on_store_error == "fail_open":
                self._emit("fail_open", error=exc)
                await self.mw.app(self.scope, self._app_receive(), self.send)
                return None
            await self._unavailable(
                "The idempotency store cannot be reached; retry later.", error=exc
            )
            return None

    # -- request body --------------------------------------------------------------------------

    async def _read_body(self) -> bytes:
        limit = self.config.max_body_size
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise _RequestTooLarge
                chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _app_receive(self, *, hide_disconnect: bool = False) -> Receive:
        body_sent = False
        receive = self.receive
        body = self.body

        async def app_receive() -> Message:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            message: Message = await receive()
            if hide_disconnect and message["type"] == "http.disconnect":
                # A protected handler runs to completion so its response is stored (guarantee
                # 4); Starlette's StreamingResponse would otherwise stop at the disconnect.
                self.client_gone = True
                await asyncio.Event().wait()
            return message

        return app_receive

    # -- running the handler -------------------------------------------------------------------

    async def _execute(self) -> None:
        config = self.config
        if config.transactional:
            begin = getattr(self.mw.store, "begin", None)
            assert begin is not None  # checked at start-up
            self.tx = begin()
        self.scope[CONTEXT_SCOPE_KEY] = self
        status = 0
        headers: list[tuple[bytes, bytes]] = []
        chunks: list[bytes] = []
        size = 0
        omitted = False
        finished = False
        held: list[Message] = []
        keeper = self.mw._leases()

        async def app_send(message: Message) -> None:
            nonlocal status, headers, size, omitted, finished
            kind = message["type"]
            if kind == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", ()))
            elif kind == "http.response.body":
                chunk = message.get("body", b"")
                if chunk and not omitted:
                    size += len(chunk)
                    if size > config.max_stored_body_size:
                        omitted = True
                        chunks.clear()
                    else:
                        chunks.append(chunk)
                if not message.get("more_body", False) and not finished:
                    finished = True
                    keeper.discard(self)
                    if self.tx is not None:
                        held.append(message)
                        await self._finish_transaction(
                            status, headers, b"".join(chunks), omitted, held
                        )
                        return
                    # Record the outcome before the last byte leaves, so a client that got the
                    # answer and retries at once is replayed, never told "in progress".
                    await self._finish(status, headers, b"".join(chunks), omitted)
            if self.tx is not None:
                # Transactional mode: nothing leaves before the commit, which may still fail.
                held.append(message)
                return
            if not self.client_gone:  # _forward, inlined: this runs for every response message
                try:
                    await self.send(message)
                except OSError:
                    self.client_gone = True

        async def run_app() -> None:
            keeper.add(self)
            try:
                await self.mw.app(self.scope, self._app_receive(hide_disconnect=True), app_send)
            except StoreError as exc:
                # The handler's transaction could not begin (lock, pool or connection): a store
                # failure like any other, answered 503, never a 500 with a traceback.
                if finished or status:
                    raise
                keeper.discard(self)
                await self._abandon()
                await self._unavailable(
                    "The idempotency store cannot be reached; retry later.",
                    error=exc,
                    phase="handler",
                )
                return
            except Exception as exc:
                if not finished and not status and self.tx is not None and self.tx.broken:
                    # The handler failed because its transaction's connection died (e.g. a
                    # terminated backend): a store failure, answered 503 like the others.
                    keeper.discard(self)
                    await self._abandon()
                    await self._unavailable(
                        "The database connection was lost; retry with the same key.",
                        error=repr(exc),
                        phase="transaction",
                    )
                    return
                if not finished:
                    keeper.discard(self)
                    await self._abandon()
                raise
            except BaseException:
                if not finished:
                    keeper.discard(self)
                    await self._abandon()
                raise
            finally:
                if self.tx is not None:
                    await self._close_transaction()
                self._emit("settled")
            # A finished response left the keeper at its last chunk (or stays in it while a
            # failed completion is retried in the background).
            if not finished:
                keeper.discard(self)
                logger.warning("handler returned without finishing its response")
                await self._abandon()

        if not self._detach():
            await run_app()
            return
        # The handler runs in its own task: when the server cancels this request (the client
        # went away), the handler still finishes and its response is stored (guarantee 4).
        task = asyncio.ensure_future(run_app())
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                raise
            self.client_gone = True
            _detached.add(task)
            task.add_done_callback(_forget)
            raise

    def _detach(self) -> bool:
        mode = self.config.detach_handler
        if mode == "auto":
            # uvicorn never cancels a request task when its client goes away (it reports
            # http.disconnect and turns send into a no-op), so the task is not needed there.
            # receive, not send: frameworks wrap send (Starlette's error middleware does) but
            # pass the server's receive through.
            server = getattr(self.receive, "__self__", None)
            return not type(server).__module__.startswith("uvicorn.")
        return mode == "always"

    async def _forward(self, message: Message) -> None:
        if self.client_gone:
            return
        try:
            await self.send(message)
        except OSError:
            # The client went away. Keep going: the response is still captured and stored, so
            # the client's retry gets the replay (guarantee 4).
            self.client_gone = True

    def _stored(
        self, status: int, headers: list[tuple[bytes, bytes]], body: bytes, omitted: bool
    ) -> bytes:
        return encode_response(
            StoredResponse(status, self._storable_headers(headers), body, omitted)
        )

    async def _finish(
        self, status: int, headers: list[tuple[bytes, bytes]], body: bytes, omitted: bool
    ) -> None:
        assert self.token is not None
        if not self.config.should_store(status):
            if self.committed:
                # Effects committed, then a failure answer: neither a result to replay nor
                # safe to run again.
                await self._declare_unknown()
            else:
                await self._release()
            return
        data = self._stored(status, headers, body, omitted)
        try:
            done = await self.mw.store.complete(
                self.record_id, self.token, data, ttl=self.config.ttl
            )
        except StoreError as exc:
            self._emit("completion_deferred", error=exc)
            self.mw._leases().add(self)  # keep the lease alive while the completion is retried
            _keep(asyncio.ensure_future(self._complete_later(data)))
            return
        if not done:
            self._lease_lost_at_completion()

    async def _complete_later(self, data: bytes) -> None:
        """Keep trying to store a response after a store failure: while the response is not
        stored the key stays reserved (or, once committed, "outcome unknown"), never free."""
        try:
            await self._retry_completion(data)
        finally:
            self.mw._leases().discard(self)

    async def _retry_completion(self, data: bytes) -> None:
        assert self.token is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _COMPLETION_RETRY_SECONDS
        delay = 0.05
        while loop.time() < deadline:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
            try:
                done = await self.mw.store.complete(
                    self.record_id, self.token, data, ttl=self.config.ttl
                )
            except StoreError:
                continue
            if done:
                self._emit("completion_recovered")
            else:
                self._lease_lost_at_completion()
            return
        self._emit("completion_failed")

    def _lease_lost_at_completion(self) -> None:
        if self.lease_lost:
            return  # already reported when a renewal found it
        self._emit(
            "lease_lost",
            "the lease was taken over before its response was stored: another request may "
            "have run the operation again (renewals failed for longer than the lease)",
            phase="completion",
        )

    async def _finish_transaction(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        omitted: bool,
        held: list[Message],
    ) -> None:
        tx = self.tx
        assert tx is not None and self.token is not None
        storable = self.config.should_store(status)
        try:
            await self._run_finalizers(storable)
        except BaseException:
            # E.g. an ORM flush failing on a constraint: nothing commits, the key is freed.
            await self._abandon()
            raise
        if not storable:
            broken = tx.broken
            await self._rollback_and_close()
            if self.committed:  # an external effect was marked without the transaction
                await self._declare_unknown()
            else:
                await self._release()
            if broken:
                # The failure answer came from the transaction's connection dying under the
                # handler: say so (503, retry) rather than pass on the framework's 500.
                held.clear()
                await self._unavailable(
                    "The database connection was lost; retry with the same key."
                )
                return
        elif not tx.begun:
            await self._finish(status, headers, body, omitted)
        else:
            data = self._stored(status, headers, body, omitted)
            try:
                done = await tx.complete(self.record_id, self.token, data, ttl=self.config.ttl)
            except StoreError as exc:
                # The commit may or may not have happened; both outcomes are consistent (the
                # writes and the record commit together), so the retry replays or runs afresh.
                await self._close_transaction()
                await self._release()  # a no-op if the commit did land (the record is complete)
                await self._unavailable(
                    "The transaction could not be committed; retry with the same key.",
                    error=exc,
                    phase="commit",
                )
                return
            if not done:
                # Fenced out: our lease was taken over and the writes were rolled back.
                self._emit("lease_lost", phase="commit")
                await self._close_transaction()
                await self._problem(
                    "idempotency-request-in-progress",
                    "The lease of this request was taken over; its writes were rolled back. "
                    "Retry later.",
                    retry_after=retry_after(self.config.lease),
                )
                return
        await self._close_transaction()
        for message in held:
            await self._forward(message)
        held.clear()

    async def _rollback_and_close(self) -> None:
        if self.tx is not None:
            try:
                await self.tx.rollback()
            except StoreError as exc:
                logger.error("rollback of %s failed: %s", self.record_id[:12], exc)
        await self._close_transaction()

    async def _close_transaction(self) -> None:
        tx, self.tx = self.tx, None
        if tx is None:
            return
        try:
            await tx.close()
        except StoreError as exc:
            logger.error("closing the transaction of %s failed: %s", self.record_id[:12], exc)

    async def _run_finalizers(self, ok: bool) -> None:
        finalizers, self.finalizers = self.finalizers, []
        for finalizer in finalizers:
            await finalizer(ok)

    async def _abandon(self) -> None:
        """The handler failed or never finished its response."""
        try:
            await self._run_finalizers(False)
        except Exception:
            logger.exception("a finalizer of %s failed", self.record_id[:12])
        if self.tx is not None:
            # Give the connection back before releasing: with a pool as small as the number of
            # requests in flight, the release would otherwise wait for a connection.
            await self._rollback_and_close()
        elif self.committed:
            await self._declare_unknown()
            return
        await self._release()

    async def _declare_unknown(self) -> None:
        """The effects are committed but there is no response to store: keep the key, and let
        its lease lapse now, so retries get "outcome unknown" at once, never a second run."""
        assert self.token is not None
        self._emit(
            "outcome_unknown", "request failed after committing its effects", phase="declared"
        )
        try:
            # mark_committed, not renew: it also lands if the handler's own mark never did.
            await self.mw.store.mark_committed(self.record_id, self.token, lease=0.0)
        except StoreError as exc:
            # The lease lapses on its own; the record stays committed either way.
            logger.error("could not end the lease of %s: %s", self.record_id[:12], exc)

    # -- what a handler can ask of the middleware ----------------------------------------------

    @property
    def transaction(self) -> AsyncTransaction | None:
        """The request's transaction in transactional mode, else ``None``."""
        return self.tx

    def add_finalizer(self, finalizer: Callable[[bool], Awaitable[None]]) -> None:
        """Run ``finalizer(ok)`` before the transaction ends (``ok``: it is about to commit),
        e.g. to flush and close an ORM session opened on it."""
        self.finalizers.append(finalizer)

    async def mark_committed(self) -> bool:
        """See :func:`retrysafe.mark_committed`."""
        if self.tx is not None and self.tx.begun:
            return True  # the effects commit with the record: nothing can fall in between
        assert self.token is not None
        # Whatever the store answers, the effect has happened: from now on this request never
        # releases its key (a failure ends in "outcome unknown", never in a rerun).
        self.committed = True
        try:
            return await self.mw.store.mark_committed(
                self.record_id, self.token, lease=self.config.lease
            )
        except StoreError as exc:
            logger.error("could not mark %s committed: %s", self.record_id[:12], exc)
            return False

    def _emit(self, event: str, message: str | None = None, /, **extra: object) -> None:
        """Report ``event`` to the ``on_event`` hook and, if non-trivial, the log."""
        hook = self.config.on_event
        level = LOG_LEVELS.get(event)
        if hook is None and level is None:
            return  # the hot path without a hook: executed/replayed/settled cost nothing
        scope = self.scope
        route = self.route
        if route is False:
            route = self.route = _route_template(scope)
        details: dict[str, object] = {
            "record": self.record_id[:16] or None,
            "path": scope.get("path"),
            "method": scope.get("method"),
            "route": route,
        }
        if extra:
            details.update((k, str(v) if k == "error" else v) for k, v in extra.items())
        if level is not None:
            log_event(event, details, message)
        if hook is not None:
            try:
                hook(event, details)
            except Exception:
                logger.exception("on_event hook failed")

    def _storable_headers(
        self, headers: list[tuple[bytes, bytes]]
    ) -> tuple[tuple[bytes, bytes], ...]:
        deny = self.config._deny_raw
        allow = self.config._allow_raw
        kept = []
        for name, value in headers:
            lname = name.lower()
            if lname in deny or (allow is not None and lname not in allow):
                continue
            kept.append((lname, value))
        return tuple(kept)

    async def _release(self) -> None:
        if self.token is None:
            return
        try:
            await self.mw.store.release(self.record_id, self.token)
        except StoreError as exc:
            # The lease lapses on its own; the key is free again after it.
            logger.error("could not release %s: %s", self.record_id[:12], exc)

    # -- answers that do not run the handler ---------------------------------------------------

    async def _replay(self, data: bytes) -> None:
        try:
            stored = decode_response(data)
        except CodecError as exc:
            await self._unavailable(
                "The stored response cannot be read.", error=exc, phase="replay"
            )
            return
        headers = list(stored.headers)
        if stored.body_omitted:
            headers = [(n, v) for n, v in headers if n != b"content-length"]
            headers.append((b"content-length", b"0"))
            headers.append(_BODY_OMITTED)
        headers.append(_REPLAYED)
        await self.send(
            {"type": "http.response.start", "status": stored.status, "headers": headers}
        )
        await self.send({"type": "http.response.body", "body": stored.body, "more_body": False})

    async def _unavailable(self, detail: str, **extra: object) -> None:
        """Answer ``503`` + ``Retry-After``: the store (or the transaction's database) failed."""
        self._emit("store_error", **extra)
        await self._problem(
            "idempotency-store-unavailable", detail, retry_after=self.config.store_retry_after
        )

    async def _too_large(self) -> None:
        self._emit("too_large")
        await self._problem(
            "idempotency-request-too-large",
            f"The request body exceeds {self.config.max_body_size} bytes.",
        )

    async def _problem(self, slug: str, detail: str, *, retry_after: int | None = None) -> None:
        status, headers, body = render_problem(
            slug,
            detail,
            type_base=self.config.problem_type_base,
            documentation_url=self.config.documentation_url,
            retry_after=retry_after,
        )
        await self._forward({"type": "http.response.start", "status": status, "headers": headers})
        await self._forward({"type": "http.response.body", "body": body, "more_body": False})


class _LeaseKeeper:
    """Renews the leases of the running handlers of one middleware, every ``lease / 3``.

    One sweeping task per event loop, not a timer per request: a timer per request costs a
    ``call_later`` and leaves a cancelled entry in the loop's heap for every fast request (the
    common case). The sweeper sleeps until the next lease is due and ends when nothing runs.
    """

    __slots__ = ("active", "loop", "task")

    def __init__(self) -> None:
        self.active: dict[_Exchange, float] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[None] | None = None

    def add(self, exchange: _Exchange) -> None:
        loop = asyncio.get_running_loop()
        self.active[exchange] = loop.time() + exchange.config.lease / 3
        if self.task is None or self.task.done() or self.loop is not loop:
            self.loop = loop
            self.task = loop.create_task(self._sweep(loop))

    def discard(self, exchange: _Exchange) -> None:
        self.active.pop(exchange, None)

    async def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        renewals: set[asyncio.Task[None]] = set()
        while self.active:
            now = loop.time()
            for exchange, due in list(self.active.items()):
                if due <= now:
                    self.active[exchange] = now + exchange.config.lease / 3
                    task = loop.create_task(self._renew(exchange))
                    renewals.add(task)
                    task.add_done_callback(renewals.discard)
            if not self.active:
                break
            wait = min(self.active.values()) - loop.time()
            await asyncio.sleep(min(1.0, max(0.005, wait)))

    async def _renew(self, ex: _Exchange) -> None:
        assert ex.token is not None
        try:
            ok = await ex.mw.store.renew(ex.record_id, ex.token, lease=ex.config.lease)
        except StoreError as exc:
            logger.warning("could not renew the lease of %s: %s", ex.record_id[:12], exc)
            return
        if not ok and ex in self.active:
            ex.lease_lost = True
            self.discard(ex)
            ex._emit("lease_lost", "lease taken over while its handler ran", phase="renew")
