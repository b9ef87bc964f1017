"""What ``?replicas=1`` costs a new key on Redis, beside the default (no wait)::

    python bench/replicas.py
    python bench/replicas.py --keys 3000 --json out.json

Starts its own redis-server master with one replica (both on free loopback ports, from PATH;
removed afterwards) and drives the stores directly, as the middleware does for a new key: a
reservation, then the completion. Figures, each the best of ``--repeat`` rounds:

- one caller: wall-clock us per new key (the latency the wait adds: one replica
  acknowledgement per write, two writes per key), async store (its lean connection) and sync
  store (redis-py);
- ``--concurrency`` callers on the async store: new keys per second, and the client's CPU us
  per key (the wait costs the client next to nothing: it is the server that holds the reply).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

LEASE = 30.0
TTL = 600.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _cli(port: int, *command: str) -> str:
    done = subprocess.run(
        ["redis-cli", "-p", str(port), *command], capture_output=True, text=True, timeout=10
    )
    return done.stdout.strip()


class Pair:
    """A redis-server master and one replica of it, on free ports, in a temporary folder."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None or shutil.which("redis-cli") is None:
            raise RuntimeError("redis-server / redis-cli not on PATH")
        self.dir = Path(tempfile.mkdtemp(prefix="retrysafe-bench-replicas-"))
        self.master, self.replica = _free_port(), _free_port()
        common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(self.dir)]
        self.procs = [
            subprocess.Popen(
                [binary, "--port", str(self.master), *common],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
            subprocess.Popen(
                [
                    *(binary, "--port", str(self.replica), *common),
                    *("--replicaof", "127.0.0.1", str(self.master)),
                    *("--repl-diskless-sync-delay", "0"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
        ]
        deadline = time.monotonic() + 15
        while "master_link_status:up" not in _cli(self.replica, "info", "replication"):
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the replica did not link up")
            time.sleep(0.05)

    def url(self, replicas: int) -> str:
        prefix = f"bench-replicas-{uuid.uuid4().hex[:8]}:"
        return f"redis://127.0.0.1:{self.master}/0?prefix={prefix}&replicas={replicas}"

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


async def _async_serial(url: str, keys: int, repeat: int) -> float:
    from retrysafe.stores.redis import AsyncRedisStore

    store = AsyncRedisStore(url)
    best = float("inf")
    try:
        await store.reserve("warm", "fp", lease=LEASE, ttl=TTL)
        for r in range(repeat):
            start = time.perf_counter()
            for i in range(keys):
                won = await store.reserve(f"s{r}-{i}", "fp", lease=LEASE, ttl=TTL)
                assert won.token and await store.complete(f"s{r}-{i}", won.token, b"r", ttl=TTL)
            best = min(best, time.perf_counter() - start)
    finally:
        await store.aclose()
    return best / keys * 1e6


def _sync_serial(url: str, keys: int, repeat: int) -> float:
    from retrysafe.stores.redis import RedisStore

    store = RedisStore(url)
    best = float("inf")
    try:
        store.reserve("warm", "fp", lease=LEASE, ttl=TTL)
        for r in range(repeat):
            start = time.perf_counter()
            for i in range(keys):
                won = store.reserve(f"s{r}-{i}", "fp", lease=LEASE, ttl=TTL)
                assert won.token and store.complete(f"s{r}-{i}", won.token, b"r", ttl=TTL)
            best = min(best, time.perf_counter() - start)
    finally:
        store.close()
    return best / keys * 1e6


async def _async_concurrent(
    url: str, keys: int, repeat: int, concurrency: int
) -> tuple[float, float]:
    from retrysafe.stores.redis import AsyncRedisStore

    store = AsyncRedisStore(url)
    best_rate, best_cpu = 0.0, float("inf")

    async def caller(r: int, c: int) -> None:
        for i in range(c, keys, concurrency):
            won = await store.reserve(f"c{r}-{i}", "fp", lease=LEASE, ttl=TTL)
            assert won.token and await store.complete(f"c{r}-{i}", won.token, b"r", ttl=TTL)

    try:
        await store.reserve("warm", "fp", lease=LEASE, ttl=TTL)
        for r in range(repeat):
            start, cpu = time.perf_counter(), time.process_time()
            await asyncio.gather(*(caller(r, c) for c in range(concurrency)))
            elapsed, used = time.perf_counter() - start, time.process_time() - cpu
            best_rate = max(best_rate, keys / elapsed)
            best_cpu = min(best_cpu, used / keys * 1e6)
    finally:
        await store.aclose()
    return best_rate, best_cpu


def measure(keys: int, repeat: int, concurrency: int) -> dict[str, dict[str, float]]:
    """Figures per ``replicas`` setting (``"0"``, ``"1"``) on one master with one replica."""
    pair = Pair()
    figures: dict[str, dict[str, float]] = {}
    try:
        for replicas in (0, 1):
            rate, cpu = asyncio.run(
                _async_concurrent(pair.url(replicas), keys, repeat, concurrency)
            )
            figures[str(replicas)] = {
                "async_us_per_key": round(
                    asyncio.run(_async_serial(pair.url(replicas), keys // 4, repeat)), 1
                ),
                "sync_us_per_key": round(_sync_serial(pair.url(replicas), keys // 4, repeat), 1),
                "concurrent_keys_per_s": round(rate),
                "concurrent_cpu_us_per_key": round(cpu, 1),
            }
    finally:
        pair.stop()
    return figures


def markdown(figures: dict[str, Any], concurrency: int) -> list[str]:
    """The report's section."""
    lines = [
        "## Redis: a new key with `?replicas=1` beside the default (bench/replicas.py)",
        "",
        "One redis-server master with one replica on loopback; a new key is a reservation and "
        "its completion, each followed by `WAIT 1` with `replicas=1`. One caller: wall-clock us "
        f"per key; {concurrency} callers on the async store: keys/s and client CPU us per key "
        "(best of 3 rounds).",
        "",
        "| replicas | async us/key | sync us/key | keys/s, "
        f"{concurrency} callers | client CPU us/key |",
        "|---|---:|---:|---:|---:|",
    ]
    for replicas, found in figures.items():
        lines.append(
            f"| {replicas} | {found['async_us_per_key']:.1f} | {found['sync_us_per_key']:.1f} "
            f"| {found['concurrent_keys_per_s']:,} | {found['concurrent_cpu_us_per_key']:.1f} |"
        )
    lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--json", help="write the figures as JSON to this file")
    args = parser.parse_args(argv)
    figures = measure(args.keys, args.repeat, args.concurrency)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    else:
        print("\n".join(markdown(figures, args.concurrency)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
