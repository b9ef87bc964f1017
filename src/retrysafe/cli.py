"""The ``retrysafe`` command: demo, proxy, request, purge, check, inspect, resolve, schema, stats.

Only here (and in framework adapters) is the environment read: ``RETRYSAFE_STORE_URL`` is the
default of every ``--store``. Every command that names a store first makes one round trip to it
(:func:`_open_store`), so a store it cannot reach or use is a non-zero exit with one line, never
a silent success (Redis' ``purge`` and ``schema`` would otherwise touch nothing).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import __version__
from ._core.config import IdempotencyConfig
from ._core.errors import ConfigurationError, IdempotencyError
from ._core.options import ConfigSource, boolean, read_options, seconds, suggestion
from ._core.scope import authorization_scope
from .ops import commands as ops
from .ops.records import target_record_id

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


def _store_arg(parser: argparse.ArgumentParser) -> None:
    # Not ``required``: $RETRYSAFE_STORE_URL gives it too, and usage must not say otherwise.
    # A command run with neither fails in _store_url, naming both.
    parser.add_argument(
        "--store",
        default=os.environ.get("RETRYSAFE_STORE_URL"),
        help="store URL (default: $RETRYSAFE_STORE_URL; one of the two is needed)",
    )


def _store_url(args: argparse.Namespace) -> str:
    """The command's store URL.

    Raises:
        ConfigurationError: neither ``--store`` nor ``$RETRYSAFE_STORE_URL`` gives one.
    """
    url: str | None = args.store
    if not url:
        raise ConfigurationError(
            f"{args.command}: no store: pass --store URL or set RETRYSAFE_STORE_URL",
            option="--store",
        )
    return url


def _store_command(
    sub: Any, name: str, run: Callable[[argparse.Namespace], int], *, help: str, description: str
) -> argparse.ArgumentParser:
    """A subcommand on one store: ``--store`` and what it runs."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help, description=description)
    _store_arg(parser)
    parser.set_defaults(func=run)
    return parser


def _key_args(parser: argparse.ArgumentParser) -> None:
    """The options that name one key: ``--key``, ``--method``, the target and the scope."""
    parser.add_argument("--key", required=True, help=_KEY_HELP)
    parser.add_argument("--method", default="POST", help=_METHOD_HELP)
    _target_args(parser)
    _scope_args(parser)


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
    try:
        from .demo.charges import DEFAULT_BROKER
        from .demo.domain import DEFAULT_STORE
    except ImportError as exc:  # pragma: no cover - the demo's modules import no extra
        print(f"retrysafe demo needs: pip install 'retrysafe[demo]' ({exc})", file=sys.stderr)
        return 2
    args.store = args.store or DEFAULT_STORE
    args.broker = args.broker or DEFAULT_BROKER
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
        "conflict_wait": "with --on-conflict wait: the longest wait for the first request, seconds",
        "on_store_error": "fail_closed: 503 + Retry-After when the store fails; fail_open: "
        "forward the request unprotected (logged)",
        "store_retry_after": "the Retry-After seconds of a 503 when the store fails",
        "canonical_json": "fingerprint JSON bodies in canonical form (key order and white space "
        "do not make another request)",
        "release_statuses": "statuses that are not stored, so the key may be retried "
        "(every 5xx is, unless --store-server-errors)",
        "replay_header_denylist": "header names never stored or replayed",
        "replay_header_allowlist": "when set, only these header names are stored and replayed",
        "on_event": "module:function called as hook(event, details) for every outcome "
        "(metrics, alerts); it must not block",
        "problem_type_base": "prefix of the RFC 9457 type of the proxy's error answers",
        "documentation_url": 'when set, error answers carry Link: <url>; rel="describedby"',
        "detach_handler": "auto, always or never: forward in a task of its own, so a client "
        "that disconnects cannot cancel it (auto: not under uvicorn, which never cancels)",
        "replay_headers": "headers set to true on every replay (add Idempotent-Replayed for "
        "Stripe's clients)",
        "retention_header": "when set (e.g. Idempotency-Key-Expires), answers carry the HTTP "
        "date until which retries with the key are deduplicated",
        "adaptive_retry_after": "a 409's Retry-After says when the first request is likely done "
        "(from how long the route's requests take), not when its lease ends",
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


def _show(report: ops.Report) -> int:
    print(report.text, file=sys.stderr if report.error else sys.stdout)
    return report.code


def _purge(args: argparse.Namespace) -> int:
    with ops.open_store(_store_url(args)) as store:
        return _show(ops.purge(store, dry_run=args.dry_run))


def _check(args: argparse.Namespace) -> int:
    url = _store_url(args)
    with ops.open_store(url) as store:
        return _show(ops.check(store, kind=ops.store_kind(url)))


def _record_id(args: argparse.Namespace) -> str:
    """The record id ``--key`` names: of a request (``--path``, ``--method``, the scope) or of
    an idempotent function's call (``--function``)."""
    return target_record_id(
        args.key, path=args.path, function=args.function, method=args.method, scope=_scope_of(args)
    )


def _inspect(args: argparse.Namespace) -> int:
    rid = _record_id(args)
    with ops.open_store(_store_url(args)) as store:
        return _show(ops.inspect(store, rid, function=args.function))


def _resolve(args: argparse.Namespace) -> int:
    rid = _record_id(args)
    with ops.open_store(_store_url(args)) as store:
        return _show(ops.resolve(store, rid, force=args.force, call=bool(args.function)))


def _schema(args: argparse.Namespace) -> int:
    # A store with tables is reached by creating them (the probe would read a table that may
    # not exist yet); one without (Redis) by the probe.
    url = _store_url(args)
    with ops.open_store(url, probe=False) as store:
        return _show(ops.schema_apply(store, kind=ops.store_kind(url)))


def _stats(args: argparse.Namespace) -> int:
    ttl = read_options({"--ttl": args.ttl}, _FLAGS, {"ttl": seconds})["ttl"].value
    url = _store_url(args)
    with ops.open_store(url) as store:
        report = ops.stats(
            store,
            kind=ops.store_kind(url),
            ttl=ttl,
            as_json=args.json,
            fail_on_unknown=args.fail_on_unknown,
        )
    return _show(report)


def _stats_parser(sub: Any) -> None:
    stats = _store_command(
        sub,
        "stats",
        _stats,
        help="count records by state (in progress, outcome unknown)",
        description="Count the store's records by state: completed, in progress (and how many "
        "with effects committed), outcome unknown, lease lapsed, expired; and the age of the "
        "oldest record in progress. With --fail-on-unknown, a monitoring check.",
    )
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

    # The demo's defaults are filled in by _demo: building the parser imports no demo module.
    demo = sub.add_parser(
        "demo",
        help="serve the OrderHub demo",
        description="Serve OrderHub, a small orders-and-payments API that shows retrysafe at "
        "work, and its page at /, in the foreground until interrupted (with a Celery worker "
        "that charges each payment, unless --no-worker).",
    )
    demo.add_argument("--host", default="127.0.0.1", help="the address to serve on")
    demo.add_argument("--port", type=int, default=8000, help="the port to serve on")
    demo.add_argument(
        "--store",
        default=os.environ.get("RETRYSAFE_STORE_URL"),
        help="store URL (default: $RETRYSAFE_STORE_URL, else a SQLite file in the current folder)",
    )
    demo.add_argument("--db", default=None, help="where orders live (default: the store's db)")
    demo.add_argument(
        "--ttl", help=f"retention, seconds or 30s/15m/2h/1d (default: {_DEFAULTS.ttl:g})"
    )
    demo.add_argument(
        "--lease",
        help=f"lease, seconds (default: {_DEFAULTS.lease:g}, or --ttl when that is shorter)",
    )
    demo.add_argument(
        "--log-level", default="info", help="the web server's log level (debug, info, warning)"
    )
    demo.add_argument(
        "--broker",
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

    purge = _store_command(
        sub,
        "purge",
        _purge,
        help="delete expired records",
        description="Delete the records whose retention (the app's ttl) has passed; a store that "
        "expires records by itself (Redis) has none. Run it from cron or a scheduled job.",
    )
    purge.add_argument("--dry-run", action="store_true", help="only count what would be deleted")
    _store_command(
        sub,
        "check",
        _check,
        help="check that a store is reachable and works",
        description=f"Check that a store is reachable and works: {ops.CHECK_WRITES}.",
    )
    _key_args(
        _store_command(
            sub,
            "inspect",
            _inspect,
            help="show the record of one key",
            description="Show what the store holds for one key: its state (in progress, "
            "completed, outcome unknown), the lease left or the stored status and body size. "
            "Name the key as the client sent the header, with the request's path, method and "
            "scope, or with --function for an idempotent function's call. Exits 1 when there is "
            "no record.",
        )
    )
    resolve = _store_command(
        sub,
        "resolve",
        _resolve,
        help="delete the record of one key (e.g. an outcome-unknown key after checking that its "
        "effects did not happen), so the next request with it runs",
        description="Delete the record of one key, so that the next request (or call) with it "
        "runs the operation. Use it for a key whose outcome is unknown, after checking that its "
        "effects did not happen. A completed record is kept unless --force: its stored "
        "response is what every retry gets. Exits 1 when nothing was deleted.",
    )
    _key_args(resolve)
    resolve.add_argument("--force", action="store_true", help="also delete a completed record")
    schema = _store_command(
        sub,
        "schema",
        _schema,
        help="create the store's tables",
        description="schema apply: create the store's table and index now, where missing (a "
        "SQL store otherwise creates them on first use): for a deployment step, or an app "
        "whose database user may not create tables. A store without tables (Redis) is only "
        "reached.",
    )
    schema.add_argument(
        "action", choices=["apply"], help="apply: create what is missing, keep what exists"
    )
    _stats_parser(sub)
    from .client._cli import add_request_arguments, run_request

    request = sub.add_parser(
        "request",
        help="send one request with the retrying client (one key, safe retries)",
        description="Send one HTTP request with an Idempotency-Key (a new one, --key, or the "
        "one --operation keeps in --journal) and retry it safely on timeouts, lost connections, "
        "502-504 and 409 in-progress answers, with the same key, until an answer, "
        "--max-attempts or --deadline. Prints the status, whether it was a replay, the key and "
        "the attempts, then the body. Exits 0 for 1xx-3xx, 1 for 4xx/5xx, 2 for bad arguments, "
        "3 when no answer came.",
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
    except (ops.OperatorError, IdempotencyError) as exc:
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
