"""Flask integration: the ``Idempotency`` extension, per-view settings, a ``flask retrysafe`` CLI.

::

    from flask import Flask
    from retrysafe.contrib.flask import Idempotency, idempotent

    app = Flask(__name__)
    Idempotency(app, store="sqlite:///idempotency.db")   # or app.config["RETRYSAFE_STORE_URL"]

    @app.post("/payments")
    @idempotent(required=True)
    def pay(): ...

The extension wraps ``app.wsgi_app`` in the pure WSGI middleware (:mod:`retrysafe.wsgi`), so the
wire contract, the stores and transactional mode are exactly those of WSGI. Per-view settings come
from ``@idempotent`` marks, found through Flask's own URL map (blueprints and ``MethodView``
included). Settings are read from the extension's keyword arguments and from ``app.config``
(``RETRYSAFE_STORE_URL``, ``RETRYSAFE_TTL``, ...: every field of
:class:`~retrysafe.IdempotencyConfig`, upper-cased, behind ``RETRYSAFE_``) and checked once, in
:meth:`Idempotency.init_app`; a bad value is a :class:`~retrysafe.ConfigurationError` there, never
an error per request.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import wsgi as _wsgi
from .._core.config import (
    OPTIONS,
    IdempotencyConfig,
    RouteOptions,
    check_store,
    config_from,
    front_store,
)
from .._core.errors import ConfigurationError, IdempotencyError
from .._core.options import ConfigSource, read_options
from .._core.routes import idempotent, route_options
from .._core.scope import authorization_scope
from ..ops import commands as ops
from ..ops.records import target_record_id
from ..stores import Store, resolve_store
from ._extra import extra

with extra("flask"):
    import click
    from flask import Flask, current_app, request
    from flask.cli import AppGroup
    from werkzeug.exceptions import HTTPException

__all__ = [
    "CONFIG_PREFIX",
    "Idempotency",
    "cli",
    "config_keys",
    "idempotent",
    "mark_committed",
    "transaction",
]

#: Every setting in ``app.config`` starts with this.
CONFIG_PREFIX = "RETRYSAFE_"
_STORE_KEY = CONFIG_PREFIX + "STORE_URL"
_EXTENSION = "retrysafe"

#: ``RETRYSAFE_TTL`` and the like, in ``app.config``.
_CONFIG = ConfigSource(where="{key} in app.config", prefix=CONFIG_PREFIX, upper=True)
_KEYWORDS = ConfigSource.keywords("Idempotency")


def config_keys() -> list[str]:
    """The ``app.config`` keys the extension reads, ``RETRYSAFE_STORE_URL`` first."""
    return [_STORE_KEY, *(_CONFIG.key(name) for name in OPTIONS)]


@dataclass(frozen=True, slots=True)
class _AppState:
    """What :meth:`Idempotency.init_app` set up for one app (``app.extensions["retrysafe"]``)."""

    extension: Idempotency
    store: Store
    store_url: str | None
    config: IdempotencyConfig
    middleware: _wsgi.IdempotencyMiddleware


class Idempotency:
    """The Flask extension: makes the app's POST/PATCH requests safe to retry.

    Args:
        app: the app to set up now; or call :meth:`init_app` later (application factories).
        store: a store URL or a synchronous store; default ``app.config["RETRYSAFE_STORE_URL"]``.
        config: all settings at once (then no ``RETRYSAFE_*`` option may be in ``app.config``).
        **options: fields of :class:`~retrysafe.IdempotencyConfig`; they win over the same
            setting in ``app.config``.

    Raises:
        ConfigurationError: an unknown option (with "did you mean") or a bad value; from
            :meth:`init_app`: no store, a bad store or ``app.config`` setting.
    """

    def __init__(
        self,
        app: Flask | None = None,
        *,
        store: str | Store | None = None,
        config: IdempotencyConfig | None = None,
        **options: Any,
    ) -> None:
        if config is not None and options:
            raise ConfigurationError("pass either config= or keyword options, not both")
        self.store = store
        self.config = config
        self.options = read_options(options, _KEYWORDS, OPTIONS)  # checked here, at once
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Set up ``app``: check the settings, wrap ``app.wsgi_app``, add the CLI group.

        The middleware wraps ``app.wsgi_app`` as it is now: WSGI middleware added later (e.g.
        ``ProxyFix``) runs outside retrysafe.

        Raises:
            ConfigurationError: no store, an unknown ``RETRYSAFE_*`` key, or a bad value (the
                message names the key).
        """
        if _EXTENSION in app.extensions:
            raise ConfigurationError(f"retrysafe is already set up on the Flask app {app.name!r}")
        from_app = read_options(
            {
                key: value
                for key, value in app.config.items()
                if key.startswith(CONFIG_PREFIX) and key != _STORE_KEY
            },
            _CONFIG,
            OPTIONS,
        )
        store = self.store if self.store is not None else app.config.get(_STORE_KEY)
        if store is None:
            raise ConfigurationError(
                f"no idempotency store for the Flask app {app.name!r}: pass "
                f"Idempotency(store=URL) or set app.config[{_STORE_KEY!r}]"
            )
        if isinstance(store, str) and not store:
            raise _CONFIG.error(_STORE_KEY, "is empty")
        if self.config is not None and from_app:
            keys = ", ".join(setting.key for setting in from_app.values())
            raise ConfigurationError(f"Idempotency(config=...) is given, so remove {keys}")
        if self.store is not None:
            resolved = front_store(resolve_store, store, _KEYWORDS)
        else:
            resolved = front_store(resolve_store, store, _CONFIG, _STORE_KEY)
        merged = {**from_app, **self.options}  # keyword options win over app.config
        config = self.config if self.config is not None else config_from(merged)
        given = merged.get("transactional")
        check_store(config, resolved, given.at if given else "transactional=True")
        middleware = _wsgi.IdempotencyMiddleware(
            app.wsgi_app, store=resolved, config=config, route_options=_view_options(app)
        )
        # Flask documents wrapping wsgi_app (not the app) so the app object stays the app.
        app.wsgi_app = middleware  # type: ignore[method-assign]
        app.extensions[_EXTENSION] = _AppState(
            self, resolved, store if isinstance(store, str) else None, config, middleware
        )
        app.cli.add_command(cli)

    @staticmethod
    def state(app: Flask) -> _AppState:
        """What :meth:`init_app` set up for ``app`` (store, settings, middleware).

        Raises:
            ConfigurationError: the app was not set up.
        """
        state = app.extensions.get(_EXTENSION)
        if not isinstance(state, _AppState):
            raise ConfigurationError(f"retrysafe is not set up on the Flask app {app.name!r}")
        return state


def _view_options(app: Flask) -> Callable[[dict[str, Any]], RouteOptions | None]:
    """The middleware's ``route_options`` hook: Flask's URL map names the view a request goes
    to; its ``@idempotent`` mark (on the function, or a ``MethodView``'s class or method) gives
    the settings, and its rule (``/orders/<int:order_id>``) the events' route."""

    def lookup(environ: dict[str, Any]) -> RouteOptions | None:
        try:
            # Flask's own adapter: SERVER_NAME, subdomains and host matching as Flask routes.
            adapter = app.create_url_adapter(app.request_class(environ, populate_request=False))
            if adapter is None:
                return None
            rule, _ = adapter.match(return_rule=True)
        except HTTPException:  # 404, 405, a redirect: the app-wide settings apply
            return None
        environ[_wsgi.ROUTE_KEY] = rule.rule  # the events' route: metrics, spans, logs
        view = app.view_functions.get(str(rule.endpoint))
        options = route_options(view)
        if options is None:
            view_class = getattr(view, "view_class", None)
            if view_class is not None:
                method = getattr(view_class, str(environ.get("REQUEST_METHOD", "")).lower(), None)
                options = route_options(method) or route_options(view_class)
        return options

    return lookup


def transaction(*, optional: bool = False) -> Any:
    """The database connection of the current Flask request's idempotent transaction.

    In transactional mode (``transactional=True`` with a SQLite or PostgreSQL store) the view's
    writes on this connection (``sqlite3.Connection`` / ``psycopg.Connection``) commit together
    with the stored response, when the response is final. Do not commit it yourself.

    Args:
        optional: return ``None`` instead of raising when the request has no transaction (no
            key on a route where the key is optional).

    Raises:
        ConfigurationError: the request does not run in transactional mode.
    """
    return _wsgi.transaction(request.environ, optional=optional)


def mark_committed() -> bool:
    """Declare that the current Flask request's side effects are committed (see
    :func:`retrysafe.mark_committed`): from now on its key is never run again.

    Returns:
        ``True`` when recorded (or the request has no key); ``False`` when the store could not
        be reached or the lease was lost.
    """
    return _wsgi.mark_committed(request.environ)


# ``flask retrysafe ...``: the operator commands of :mod:`retrysafe.ops.commands` (those of the
# ``retrysafe`` command), on the app's store.
cli = AppGroup(_EXTENSION, help="Idempotency records of this app's retrysafe store.")

_store_option = click.option(
    "--store", "store_url", default=None, help="store URL (default: the app's retrysafe store)"
)


def _key_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the options that name one key; ``command`` receives the record id they name as
    ``rid`` and the function's name (or ``None``) as ``function``."""

    @functools.wraps(command)
    def with_record_id(
        *args: Any,
        key: str,
        path: str | None,
        function: str | None,
        method: str,
        scope: str | None,
        authorization: str | None,
        **kwargs: Any,
    ) -> Any:
        if scope is not None and authorization is not None:
            raise click.UsageError("pass --scope or --authorization, not both")
        if (path is None) == (function is None):
            raise click.UsageError("pass --path (a request's key) or --function (a call's key)")
        if authorization is not None:
            scope = authorization_scope(authorization)
        rid = _operate(
            target_record_id,
            key,
            path=path,
            function=function,
            method=method,
            scope=scope or "",
        )
        return command(*args, rid=rid, function=function, **kwargs)

    for option in reversed(
        [
            click.option(
                "--key",
                required=True,
                help="the Idempotency-Key header's value as sent: '\"k1\"' or k1",
            ),
            click.option("--path", default=None, help="the request path, e.g. /orders"),
            click.option(
                "--function",
                default=None,
                help="instead of --path: the name an idempotent function's keys are scoped by",
            ),
            click.option("--method", default="POST", show_default=True),
            click.option("--scope", default=None, help="the scope the key belongs to"),
            click.option(
                "--authorization", default=None, help="the Authorization header it came with"
            ),
        ]
    ):
        with_record_id = option(with_record_id)
    return with_record_id


def _operate(work: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``work``; a store or setting that fails is one ``retrysafe:`` line, exit status 2
    (as the ``retrysafe`` command says it)."""
    try:
        return work(*args, **kwargs)
    except (ops.OperatorError, IdempotencyError) as exc:
        click.echo("retrysafe: " + " ".join(str(exc).split()), err=True)
        raise click.exceptions.Exit(2) from exc


def _run(store_url: str | None, command: Callable[[Store, str], ops.Report]) -> None:
    """Open the store (``--store``, else the app's store URL) and run one operator command on
    it; ``command`` gets the store and its kind (``sqlite``...)."""
    if store_url is None:
        store_url = Idempotency.state(current_app).store_url
        if store_url is None:
            raise click.UsageError(
                "the app's store was given as an object, not a URL: pass --store URL"
            )
    url = store_url

    def work() -> ops.Report:
        with ops.open_store(url) as store:
            return command(store, ops.store_kind(url))

    report: ops.Report = _operate(work)
    click.echo(report.text, err=report.error)
    if report.code:
        raise click.exceptions.Exit(report.code)


@cli.command("purge")
@_store_option
def _purge(store_url: str | None) -> None:
    """Delete expired records."""
    _run(store_url, lambda store, kind: ops.purge(store))


@cli.command("check")
@_store_option
def _check(store_url: str | None) -> None:
    """Check that the store is reachable (a reserve/release round trip)."""
    _run(store_url, lambda store, kind: ops.check(store, kind=kind))


@cli.command("inspect")
@_store_option
@_key_options
def _inspect(store_url: str | None, rid: str, function: str | None) -> None:
    """Show the record of one key (exit 1 when there is none)."""
    _run(store_url, lambda store, kind: ops.inspect(store, rid, function=function))


@cli.command("resolve")
@_store_option
@_key_options
@click.option("--force", is_flag=True, help="also delete a completed record")
def _resolve(store_url: str | None, rid: str, function: str | None, force: bool) -> None:
    """Delete the record of one key (an outcome-unknown key, after checking its effects), so
    the next request or call with it runs."""
    _run(
        store_url,
        lambda store, kind: ops.resolve(store, rid, force=force, call=function is not None),
    )
