"""The ``retrysafe`` command: demo, purge, check, inspect, resolve, schema, stats.

Only here (and in framework adapters) is the environment read: ``RETRYSAFE_STORE_URL`` is the
default of every ``--store``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from ._errors import IdempotencyError
from ._keys import record_id
from ._scope import authorization_scope
from .stores import store_from_url

__all__ = ["main"]


def _store_arg(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    parser.add_argument(
        "--store",
        default=os.environ.get("RETRYSAFE_STORE_URL", default),
        required=default is None and "RETRYSAFE_STORE_URL" not in os.environ,
        help="store URL (default: $RETRYSAFE_STORE_URL)",
    )


def _scope_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--scope", default="", help="the scope the key belongs to (default global)")
    group.add_argument(
        "--authorization",
        help="the Authorization header the key was sent with (its hash is the default scope)",
    )


def _scope_of(args: argparse.Namespace) -> str:
    if args.authorization:
        return authorization_scope(args.authorization)
    scope: str = args.scope
    return scope


def _demo(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from .demo.app import create_app
    except ImportError as exc:
        print(f"retrysafe demo needs: pip install 'retrysafe[demo]' ({exc})", file=sys.stderr)
        return 2
    app = create_app(store=args.store, db=args.db, ttl=args.ttl, lease=args.lease)
    print(f"OrderHub on http://{args.host}:{args.port}/ (store {args.store})", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def _purge(args: argparse.Namespace) -> int:
    if args.dry_run:
        return _purge_dry_run(args)
    store = store_from_url(args.store)
    try:
        print(f"purged {store.purge_expired()} expired records")
    finally:
        store.close()
    return 0


def _check(args: argparse.Namespace) -> int:
    store = store_from_url(args.store)
    try:
        probe = "retrysafe-check:" + os.urandom(8).hex()
        reservation = store.reserve(probe, "check", lease=5.0, ttl=10.0)
        if reservation.token is None or not store.release(probe, reservation.token):
            print("store answered, but a reserve/release round trip failed", file=sys.stderr)
            return 1
    finally:
        store.close()
    print(f"ok: {args.store.split('://')[0]} store reachable; reserve and release work")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    rid = record_id(_scope_of(args), args.method.upper(), args.path, args.key)
    store = store_from_url(args.store)
    try:
        record = store.get(rid)
    finally:
        store.close()
    if record is None:
        print(f"record {rid[:16]}: none (never used, released, or expired)")
        return 1
    state: str = record.state
    if state == "in_progress" and record.committed:
        state = "in_progress, effects committed"
        if record.lease_remaining <= 0:
            state = "OUTCOME UNKNOWN (effects committed, response never stored)"
    print(f"record {rid[:16]}: {state}")
    if record.state == "in_progress":
        print(f"  lease remaining: {record.lease_remaining:.1f} s")
    elif record.response is not None:
        from ._codec import decode_response

        stored = decode_response(record.response)
        print(f"  status: {stored.status}, body: {len(stored.body)} bytes")
    return 0


def _resolve(args: argparse.Namespace) -> int:
    rid = record_id(_scope_of(args), args.method.upper(), args.path, args.key)
    store = store_from_url(args.store)
    try:
        record = store.get(rid)
        if record is None:
            print(f"record {rid[:16]}: none; nothing to resolve")
            return 1
        if record.state == "completed" and not args.force:
            print(f"record {rid[:16]} is completed; use --force to delete a stored response")
            return 1
        store.delete(rid)
    finally:
        store.close()
    print(f"record {rid[:16]} deleted: the next request with this key runs the operation")
    return 0


def _schema(args: argparse.Namespace) -> int:
    store = store_from_url(args.store)
    try:
        ensure = getattr(store, "ensure_schema", None)
        if ensure is not None:
            ensure()
    finally:
        store.close()
    print(f"schema ready in {args.store.split('://')[0]} store")
    return 0


def _purge_dry_run(args: argparse.Namespace) -> int:
    from ._stats import store_stats

    store = store_from_url(args.store)
    try:
        expired = store_stats(store).expired
    finally:
        store.close()
    if args.store.startswith(("redis://", "rediss://")):
        print("would purge 0 expired records (Redis expires records by itself)")
    else:
        print(f"would purge {expired} expired records (dry run: nothing deleted)")
    return 0


def _stats(args: argparse.Namespace) -> int:
    import json

    from ._stats import store_stats

    store = store_from_url(args.store)
    try:
        stats = store_stats(store)
    finally:
        store.close()
    left = stats.oldest_in_progress_retention_left
    oldest = None if left is None else max(0.0, args.ttl - left)
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
            print(f"oldest in progress: started {oldest:.0f} s ago (for --ttl {args.ttl:g})")
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
        type=float,
        default=24 * 3600.0,
        help="the retention the app uses, seconds (ages are derived from it; default 86400)",
    )
    stats.add_argument("--json", action="store_true", help="one JSON object instead of text")
    stats.add_argument(
        "--fail-on-unknown",
        action="store_true",
        help="exit 1 when some key's outcome is unknown (for a monitoring check)",
    )
    stats.set_defaults(func=_stats)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``retrysafe`` command."""
    parser = argparse.ArgumentParser(prog="retrysafe", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="serve the OrderHub demo")
    demo.add_argument("--host", default="127.0.0.1")
    demo.add_argument("--port", type=int, default=8000)
    _store_arg(demo, "sqlite:///./retrysafe-demo.db")
    demo.add_argument("--db", default=None, help="where orders live (default: the store's db)")
    demo.add_argument("--ttl", type=float, default=24 * 3600.0, help="retention, seconds")
    demo.add_argument("--lease", type=float, default=30.0, help="lease, seconds")
    demo.add_argument("--log-level", default="info")
    demo.set_defaults(func=_demo)

    purge = sub.add_parser("purge", help="delete expired records")
    _store_arg(purge)
    purge.add_argument("--dry-run", action="store_true", help="only count what would be deleted")
    purge.set_defaults(func=_purge)

    check = sub.add_parser("check", help="check that a store is reachable and works")
    _store_arg(check)
    check.set_defaults(func=_check)

    inspect = sub.add_parser("inspect", help="show the record of one key")
    _store_arg(inspect)
    inspect.add_argument("--key", required=True)
    inspect.add_argument("--method", default="POST")
    inspect.add_argument("--path", required=True)
    _scope_args(inspect)
    inspect.set_defaults(func=_inspect)

    resolve = sub.add_parser(
        "resolve",
        help="delete the record of one key (e.g. an outcome-unknown key after checking that its "
        "effects did not happen), so the next request with it runs",
    )
    _store_arg(resolve)
    resolve.add_argument("--key", required=True)
    resolve.add_argument("--method", default="POST")
    resolve.add_argument("--path", required=True)
    _scope_args(resolve)
    resolve.add_argument("--force", action="store_true", help="also delete a completed record")
    resolve.set_defaults(func=_resolve)

    schema = sub.add_parser("schema", help="create the store's tables")
    schema.add_argument("action", choices=["apply"])
    _store_arg(schema)
    schema.set_defaults(func=_schema)
    _stats_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except IdempotencyError as exc:
        print(f"retrysafe: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
