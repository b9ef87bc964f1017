"""The ``retrysafe`` command: demo, proxy, request, purge, check, inspect, resolve, schema, stats.

Only here (and in framework adapters) is the environment read: ``RETRYSAFE_STORE_URL`` is the
default of every ``--store``. Every command that names a store first makes one round trip to it
(:func:`_open_store`), so a store it cannot reach or use is a non-zero exit with one line, never
a silent success (Redis' ``purge`` and ``schema`` would otherwise touch nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from . import __version__
from ._core.config import IdempotencyConfig
from ._core.errors import ConfigurationError, IdempotencyError
from ._core.options import ConfigSource, boolean, read_options, seconds, suggestion
from ._core.scope import authorization_scope
from .stores import Store, store_from_url

__all__ = ["main"]

_DESCRIPTION = """\
Inspect and maintain retrysafe stores, and serve the OrderHub demo.
Every --store defaults to $RETRYSAFE_STORE_URL."""

#: Options given as flags: ``--ttl`` names ``ttl`` (errors name the flag).
_FLAGS = ConfigSource(flags=True)
_DEFAULTS = IdempotencyConfig()

#: The frameworks ``retrysafe demo`` serves OrderHub on, the first the default: the keys of
#: ``demo.serve.SERVERS``, named here so that building the parser (``retrysafe --help``, every
#: other subcommand) imports no framework (a test keeps the two lists equal).
DEMO_FRAMEWORKS = ("starlette", "fastapi", "flask", "django")


class _StoreFailed(Exception):
    """A store could not be opened or used; carries the one line to print."""


#: The extra that brings a store driver, for a store that imports its driver on first use.
_DRIVER_EXTRAS = {"psycopg": "postgres", "psycopg_pool": "postgres", "redis": "redis"}


def _reach(operation: Callable[..., object], *args: object) -> None:
    """Run one store operation; a store error becomes the command's one-line failure."""
    try:
        operation(*args)
    except IdempotencyError as exc:
        raise _StoreFailed(f"cannot use the store: {exc}") from exc
    except ImportError as exc:  # a driver imported on first use is not installed
        extra = _DRIVER_EXTRAS.get((exc.name or "").partition(".")[0])
        hint = f": pip install 'retrysafe[{extra}]'" if extra else ""
        raise _StoreFailed(f"cannot use the store, a driver is missing ({exc}){hint}") from exc


@contextlib.contextmanager
def _open_store(url: str, *, probe: bool = True) -> Iterator[Store]:
    """Build the store a URL names and make one round trip to it, closing it afterwards.

    The round trip (a read of a key nobody uses) is what tells an unreachable server, a Redis
    database that does not exist or a SQLite path that cannot be opened from a working store,
    whichever command runs next. ``probe=False`` leaves it to the command (``schema apply``,
    whose table may not exist yet).

    Raises:
        _StoreFailed: the URL is invalid or the store cannot be reached or used.
    """
    try:
        store = store_from_url(url)
    except (IdempotencyError, ValueError) as exc:
        raise _StoreFailed(f"invalid store URL: {exc}") from exc
    try:
        if probe:
            _reach(store.get, "retrysafe-cli-probe")
        yield store
    finally:
        with contextlib.suppress(Exception):  # closing a store that never connected may fail
            store.close()


def _store_arg(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    parser.add_argument(
        "--store",
        default=os.environ.get("RETRYSAFE_STORE_URL", default),
        required=default is None and "RETRYSAFE_STORE_URL" not in os.environ,
        help="store URL (default: $RETRYSAFE_STORE_URL)",
    )


_KEY_HELP = "the Idempotency-Key header's value as sent: '\"k1\"' (an sf-string) or k1"
_METHOD_HELP = "the request's method (default POST; not with --function)"


def _scope_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--scope", default="", help="the scope the key belongs to (default global)")
    group.add_argument(
        "--authorization",
        help="the Authorization header the key was sent with (its hash is the default scope)",
    )


def _target_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument(
        "--path", help="the path the request's key was used on, as sent (/caf%%C3%%A9, /a%%2Fb)"
    )
    group.add_argument(
        "--function", help="the name an idempotent function's keys are scoped by (its qualname)"
    )


def _scope_of(args: argparse.Namespace) -> str:
    if args.authorization:
        return authorization_scope(args.authorization)
    scope: str = args.scope
    return scope


def _demo(args: argparse.Namespace) -> int:
    # Read as every front reads settings: "--ttl 2h" works, "--ttl soon" is one clear line, and
    # a short --ttl brings the lease down with it unless --lease is given.
    flags = {"--ttl": args.ttl, "--lease": args.lease}
    config = IdempotencyConfig.from_mapping(
        {flag: value for flag, value in flags.items() if value is not None}, source=_FLAGS
    )
    args.ttl, args.lease = config.ttl, config.lease
    print(
        f"OrderHub ({args.framework}) on http://{args.host}:{args.port}/ (store {args.store})",
        flush=True,
    )
    try:
        from .demo.serve import SERVERS

        SERVERS[args.framework](args)
    except ImportError as exc:
        print(f"retrysafe demo needs: pip install 'retrysafe[demo]' ({exc})", file=sys.stderr)
        return 2
    return 0


#: Where ``retrysafe proxy`` hands its settings to uvicorn's worker processes.
_PROXY_SETTINGS_ENV = "_RETRYSAFE_PROXY_SETTINGS"


def _proxy(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from .proxy import OPTIONS, build_app, load_settings
        from .proxy.app import tune_gc
    except ImportError as exc:
        print(f"retrysafe proxy needs: pip install 'retrysafe[proxy]' ({exc})", file=sys.stderr)
        return 2
    flags = {name: getattr(args, name, None) for name in OPTIONS}
    settings = load_settings(flags, os.environ, args.config or os.environ.get("RETRYSAFE_CONFIG"))
    app = build_app(settings)  # every setting and the store URL checked before serving
    host, port = settings.listen_address()
    print(
        f"retrysafe proxy on http://{settings.listen} -> {settings.upstream} "
        f"(store {settings.store.split('://')[0]}, {settings.workers} worker(s))",
        flush=True,
    )
    common: dict[str, Any] = {
        "host": host,
        "port": port,
        "log_level": settings.log_level,
        "access_log": settings.access_log,
        "lifespan": "on",
        # Forwarded headers are the proxy's own business (--trust-forwarded), and the
        # upstream's Date and Server pass through instead of uvicorn's.
        "proxy_headers": False,
        "server_header": False,
        "date_header": False,
    }
    if settings.workers == 1:
        tune_gc()
        uvicorn.run(app, **common)
        return 0
    # Workers are separate processes that import the app: they rebuild it from the settings.
    os.environ[_PROXY_SETTINGS_ENV] = settings.to_json()
    uvicorn.run("retrysafe.cli:_proxy_worker_app", factory=True, workers=settings.workers, **common)
    return 0


def _proxy_worker_app() -> object:
    """The app of one ``retrysafe proxy`` worker process (uvicorn factory)."""
    from .proxy import ProxySettings, build_app
    from .proxy.app import tune_gc

    app = build_app(ProxySettings.from_json(os.environ[_PROXY_SETTINGS_ENV]))
    tune_gc()
    return app


def _proxy_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from .proxy.sources import OPTIONS, default, variable

    proxy = sub.add_parser(
        "proxy",
        help="serve an idempotency proxy in front of an HTTP backend in any language",
        description="Every option also comes from RETRYSAFE_<OPTION> (the store from "
        "RETRYSAFE_STORE_URL) or from the TOML --config file (top-level options and [[routes]] "
        "tables with path, enabled and any middleware option: methods, required, ttl, lease...); "
        "a flag wins over the environment, which wins over the file. Seconds take 30, 2.5 or "
        "30s, 15m, 2h, 1d; lists a comma-separated string.",
    )
    proxy.add_argument("--config", help="TOML file (default: $RETRYSAFE_CONFIG)")
    helps = {
        "listen": "HOST:PORT to serve on",
        "upstream": "base URL of the backend, e.g. http://127.0.0.1:9000",
        "store": "store URL",
        "workers": "uvicorn worker processes",
        "methods": "protected methods, comma-separated",
        "required": "a protected request without a key gets 400",
        "ttl": "retention of completed records, seconds",
        "lease": "lease of a reservation, seconds (follows a shorter --ttl)",
        "max_body_size": "larger keyed request bodies get 413",
        "max_stored_body_size": "larger responses stream through but are not stored",
        "on_conflict": "reject (409) or wait for the first request of a key",
        "store_server_errors": "store upstream 5xx answers instead of releasing the key",
        "on_ambiguous": "unknown: a request sent without an answer is never forwarded again "
        "(409 outcome-unknown); release: free the key (idempotent upstreams)",
        "principal_header": "header whose value scopes keys",
        "trust_forwarded": "keep and extend incoming Forwarded/X-Forwarded-* headers",
        "connect_timeout": "seconds to connect to the upstream",
        "upstream_timeout": "seconds for each upstream read or write",
        "max_connections": "upstream connection pool size per worker",
        "log_level": "uvicorn log level",
        "access_log": "uvicorn's access log, a line per request",
    }
    for name, coerce in OPTIONS.items():
        value = default(name)
        shown = "required" if value is ... else f"default {value!r}"
        if isinstance(value, frozenset | tuple):
            shown = "default " + ",".join(sorted(str(v) for v in value))
        text = f"{helps.get(name, f'see IdempotencyConfig.{name}')} (${variable(name)}; {shown})"
        flag = _FLAGS.key(name)
        if coerce is boolean:
            proxy.add_argument(flag, action=argparse.BooleanOptionalAction, help=text)
        else:  # read (and checked) by the proxy's loader, which names the flag in errors
            proxy.add_argument(flag, help=text)
    proxy.set_defaults(func=_proxy)


def _purge(args: argparse.Namespace) -> int:
    if args.dry_run:
        return _purge_dry_run(args)
    with _open_store(args.store) as store:
        print(f"purged {store.purge_expired()} expired records")
    return 0


#: What ``retrysafe check`` writes, said in its help and in its output line.
_CHECK_WRITES = (
    "reserves a probe key and releases it again, so nothing stays behind but the records "
    "table, which a SQL store creates if it is missing (as the app's first request would)"
)


def _check(args: argparse.Namespace) -> int:
    with _open_store(args.store) as store:
        probe = "retrysafe-check:" + os.urandom(8).hex()
        reservation = store.reserve(probe, "check", lease=5.0, ttl=10.0)
        if reservation.token is None or not store.release(probe, reservation.token):
            print("store answered, but a reserve/release round trip failed", file=sys.stderr)
            return 1
    print(
        f"ok: {args.store.split('://')[0]} store reachable; a probe key was reserved and "
        "released (its records table exists: created now if it was missing)"
    )
    return 0


def _record_id(args: argparse.Namespace) -> str:
    """The record id ``--key`` names: of a request (``--path``, ``--method``, the scope) or of
    an idempotent function's call (``--function``)."""
    from .ops.records import target_record_id

    return target_record_id(
        args.key, path=args.path, function=args.function, method=args.method, scope=_scope_of(args)
    )


def _inspect(args: argparse.Namespace) -> int:
    from .ops.records import describe

    rid = _record_id(args)
    with _open_store(args.store) as store:
        record = store.get(rid)
    print("\n".join(describe(rid, record, function=args.function)))
    return 0 if record is not None else 1


def _resolve(args: argparse.Namespace) -> int:
    from .ops.records import resolve

    rid = _record_id(args)
    with _open_store(args.store) as store:
        deleted, message = resolve(store, rid, force=args.force, call=bool(args.function))
    print(message)
    return 0 if deleted else 1


def _schema(args: argparse.Namespace) -> int:
    # A store with tables is reached by creating them (the probe would read a table that may
    # not exist yet); one without (Redis) by the probe.
    with _open_store(args.store, probe=False) as store:
        ensure = getattr(store, "ensure_schema", None)
        if ensure is not None:
            _reach(ensure)
        else:
            _reach(store.get, "retrysafe-cli-probe")
    print(f"schema ready in {args.store.split('://')[0]} store")
    return 0


def _purge_dry_run(args: argparse.Namespace) -> int:
    from .ops.stats import store_stats

    with _open_store(args.store) as store:
        expired = store_stats(store).expired
        by_itself = getattr(store, "expires_records", False)
    if by_itself:
        print("would purge 0 expired records (the store expires records by itself)")
    else:
        print(f"would purge {expired} expired records (dry run: nothing deleted)")
    return 0


def _stats(args: argparse.Namespace) -> int:
    import json

    from .ops.stats import store_stats

    with _open_store(args.store) as store:
        stats = store_stats(store)
    left = stats.oldest_in_progress_retention_left
    ttl = read_options({"--ttl": args.ttl}, _FLAGS, {"ttl": seconds})["ttl"].value
    oldest = None if left is None else max(0.0, ttl - left)
    if args.json:
        print(json.dumps({**stats.as_dict(), "oldest_in_progress_age": oldest}, sort_keys=True))
    else:
        print(f"store: {args.store.split('://')[0]}")
        print(f"completed: {stats.completed}")
        print(
            f"in progress: {stats.in_progress + stats.committed} ({stats.committed} with "
            "effects committed)"
        )
        if oldest is None:
            print("oldest in progress: none")
        else:
            print(f"oldest in progress: started {oldest:.0f} s ago (for --ttl {ttl:g})")
        print(
            f"outcome unknown: {stats.outcome_unknown}"
            + (" (retrysafe inspect / resolve)" if stats.outcome_unknown else "")
        )
        print(f"lease lapsed (taken over on retry): {stats.lapsed}")
        print(f"expired (retrysafe purge deletes them): {stats.expired}")
    return 1 if args.fail_on_unknown and stats.outcome_unknown else 0


def _stats_parser(sub: Any) -> None:
    stats = sub.add_parser("stats", help="count records by state (in progress, outcome unknown)")
    _store_arg(stats)
    stats.add_argument(
        "--ttl",
        default=_DEFAULTS.ttl,
        help="the retention the app uses, seconds or 30s/15m/2h/1d (ages are derived from it; "
        f"default {_DEFAULTS.ttl:g})",
    )
    stats.add_argument("--json", action="store_true", help="one JSON object instead of text")
    stats.add_argument(
        "--fail-on-unknown",
        action="store_true",
        help="exit 1 when some key's outcome is unknown (for a monitoring check)",
    )
    stats.set_defaults(func=_stats)


def loaded_build() -> str:
    """Which build of the package is loaded: the pure-Python reference, or the one whose hot
    path is compiled with mypyc (C extensions beside the ``.py`` files, imported first)."""
    from ._core import http

    return "pure Python" if (http.__file__ or "").endswith(".py") else "compiled with mypyc"


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``retrysafe`` command."""
    parser = argparse.ArgumentParser(
        prog="retrysafe",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"retrysafe {__version__} ({loaded_build()})"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    from .demo.charges import DEFAULT_BROKER  # imports neither a framework nor Celery
    from .demo.domain import DEFAULT_STORE

    demo = sub.add_parser("demo", help="serve the OrderHub demo")
    demo.add_argument("--host", default="127.0.0.1")
    demo.add_argument("--port", type=int, default=8000)
    _store_arg(demo, DEFAULT_STORE)
    demo.add_argument("--db", default=None, help="where orders live (default: the store's db)")
    demo.add_argument(
        "--ttl", help=f"retention, seconds or 30s/15m/2h/1d (default: {_DEFAULTS.ttl:g})"
    )
    demo.add_argument(
        "--lease",
        help=f"lease, seconds (default: {_DEFAULTS.lease:g}, or --ttl when that is shorter)",
    )
    demo.add_argument("--log-level", default="info")
    demo.add_argument(
        "--broker",
        default=DEFAULT_BROKER,
        help="the Celery broker of the charge worker (default: a folder, no server)",
    )
    demo.add_argument(
        "--no-worker", action="store_true", help="serve the web app without the Celery worker"
    )
    demo.add_argument(
        "--framework", choices=DEMO_FRAMEWORKS, default=DEMO_FRAMEWORKS[0], help="which OrderHub"
    )
    demo.set_defaults(func=_demo)

    _proxy_parser(sub)

    purge = sub.add_parser("purge", help="delete expired records")
    _store_arg(purge)
    purge.add_argument("--dry-run", action="store_true", help="only count what would be deleted")
    purge.set_defaults(func=_purge)

    check = sub.add_parser(
        "check",
        help="check that a store is reachable and works",
        description=f"Check that a store is reachable and works: {_CHECK_WRITES}.",
    )
    _store_arg(check)
    check.set_defaults(func=_check)

    inspect = sub.add_parser("inspect", help="show the record of one key")
    _store_arg(inspect)
    inspect.add_argument("--key", required=True, help=_KEY_HELP)
    inspect.add_argument("--method", default="POST", help=_METHOD_HELP)
    _target_args(inspect)
    _scope_args(inspect)
    inspect.set_defaults(func=_inspect)

    resolve = sub.add_parser(
        "resolve",
        help="delete the record of one key (e.g. an outcome-unknown key after checking that its "
        "effects did not happen), so the next request with it runs",
    )
    _store_arg(resolve)
    resolve.add_argument("--key", required=True, help=_KEY_HELP)
    resolve.add_argument("--method", default="POST", help=_METHOD_HELP)
    _target_args(resolve)
    _scope_args(resolve)
    resolve.add_argument("--force", action="store_true", help="also delete a completed record")
    resolve.set_defaults(func=_resolve)

    schema = sub.add_parser("schema", help="create the store's tables")
    schema.add_argument("action", choices=["apply"])
    _store_arg(schema)
    schema.set_defaults(func=_schema)
    _stats_parser(sub)
    from .client._cli import add_request_arguments, run_request

    request = sub.add_parser(
        "request", help="send one request with the retrying client (one key, safe retries)"
    )
    add_request_arguments(request)
    request.set_defaults(func=run_request)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    try:
        if unknown:
            raise _unknown_arguments(parser, args, unknown)
        code: int = args.func(args)
    except (_StoreFailed, IdempotencyError) as exc:
        _fail(str(exc))
        return 2
    return code


def _unknown_arguments(
    parser: argparse.ArgumentParser, args: argparse.Namespace, unknown: list[str]
) -> ConfigurationError:
    """An unknown flag is an unknown option: one line, with the closest flag of the command."""
    flag = next((arg.partition("=")[0] for arg in unknown if arg.startswith("-")), None)
    if flag is None:
        return ConfigurationError(f"unexpected argument {unknown[0]!r}")
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command = commands.choices.get(args.command)
    known = [option for a in command._actions for option in a.option_strings] if command else []
    return ConfigurationError(f"{flag}: unknown option{suggestion(flag, known)}", option=flag)


def _fail(message: str) -> None:
    """Print one line to stderr: driver messages can span lines (libpq adds a hint line)."""
    print("retrysafe: " + " ".join(message.split()), file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
