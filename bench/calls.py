"""What a keyed call costs over the bare call: ``idempotent_function`` on each store, def and
async def, first calls (a new key each) and duplicates (the stored result)::

    python bench/calls.py                                  # memory and SQLite
    python bench/calls.py --postgres-url postgresql://postgres@127.0.0.1/test \\
                          --redis-url redis://127.0.0.1:6379/0
    python bench/calls.py --json out.json

Each figure is the best of ``--repeat`` rounds of ``--calls`` calls, in wall-clock microseconds
per call (one caller: the latency a call adds, store round trips included). The function itself
returns a small dict. PostgreSQL gets a table of its own and Redis a key prefix of its own, both
removed afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from retrysafe import idempotent_function


def _bare(n: int) -> dict[str, int]:
    return {"n": n}


async def _abare(n: int) -> dict[str, int]:
    return {"n": n}


def _best(rounds: list[float], calls: int) -> float:
    return round(min(rounds) / calls * 1e6, 2)


def measure_sync(url: str, calls: int, repeat: int) -> dict[str, float]:
    keyed = idempotent_function(_bare, store=url, key="n", name=f"bench-{uuid.uuid4().hex}")
    base = 0
    figures: dict[str, list[float]] = {"bare": [], "new key": [], "replay": []}
    try:
        keyed(-1)  # connections and tables in place before timing
        for _ in range(repeat):
            for name, run in (("bare", _bare), ("new key", keyed)):
                start = time.perf_counter()
                for i in range(base, base + calls):
                    run(i)
                figures[name].append(time.perf_counter() - start)
            start = time.perf_counter()
            for i in range(base, base + calls):
                keyed(i)  # each key was used in the round above: every call is a duplicate
            figures["replay"].append(time.perf_counter() - start)
            base += calls
    finally:
        keyed.close()
    return {name: _best(rounds, calls) for name, rounds in figures.items()}


def measure_async(url: str, calls: int, repeat: int) -> dict[str, float]:
    async def main() -> dict[str, float]:
        keyed = idempotent_function(_abare, store=url, key="n", name=f"bench-{uuid.uuid4().hex}")
        base = 0
        figures: dict[str, list[float]] = {"bare": [], "new key": [], "replay": []}
        try:
            await keyed(-1)
            for _ in range(repeat):
                for name, run in (("bare", _abare), ("new key", keyed)):
                    start = time.perf_counter()
                    for i in range(base, base + calls):
                        await run(i)
                    figures[name].append(time.perf_counter() - start)
                start = time.perf_counter()
                for i in range(base, base + calls):
                    await keyed(i)
                figures["replay"].append(time.perf_counter() - start)
                base += calls
        finally:
            await keyed.aclose()
        return {name: _best(rounds, calls) for name, rounds in figures.items()}

    return asyncio.run(main())


def _cleanup_postgres(url: str, table: str) -> None:
    import psycopg

    with psycopg.connect(url.split("?", 1)[0], autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")


def _cleanup_redis(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def run(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Every store asked for, both faces: ``{"<store> <face>": {bare, new key, replay, ...}}``."""
    nonce = uuid.uuid4().hex[:10]
    tmp = Path(tempfile.mkdtemp(prefix="retrysafe-bench-calls-"))
    stores: list[tuple[str, str, int, Callable[[], None] | None]] = [
        ("memory", "memory://", args.calls, None),
        ("sqlite", f"sqlite:///{tmp}/calls.db", args.calls, None),
    ]
    if args.postgres_url:
        table = f"retrysafe_bench_calls_{nonce}"
        sep = "&" if "?" in args.postgres_url else "?"
        url = f"{args.postgres_url}{sep}table={table}"
        stores.append(
            ("postgres", url, args.calls // 4, lambda: _cleanup_postgres(args.postgres_url, table))
        )
    if args.redis_url:
        prefix = f"retrysafe-bench-calls-{nonce}:"
        sep = "&" if "?" in args.redis_url else "?"
        url = f"{args.redis_url}{sep}prefix={prefix}"
        stores.append(
            ("redis", url, args.calls // 4, lambda: _cleanup_redis(args.redis_url, prefix))
        )
    found: dict[str, dict[str, float]] = {}
    for name, url, calls, cleanup in stores:
        try:
            for face, measure in (("def", measure_sync), ("async def", measure_async)):
                figures: dict[str, Any] = measure(url, calls, args.repeat)
                figures["overhead"] = round(figures["new key"] - figures["bare"], 2)
                figures["replay overhead"] = round(figures["replay"] - figures["bare"], 2)
                found[f"{name} {face}"] = figures
                print(
                    f"{name:8s} {face:9s}  bare {figures['bare']:8.2f} us   "
                    f"new key {figures['new key']:8.2f} us   replay {figures['replay']:8.2f} us",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            if cleanup is not None:
                cleanup()
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per round (memory/SQLite)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--postgres-url", default="")
    parser.add_argument("--redis-url", default="")
    parser.add_argument("--json", default="", help="write the figures here")
    args = parser.parse_args(argv)
    found = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
