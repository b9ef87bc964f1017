"""How long a writer waits for SQLite's single write lock on a busy file, with and without turns.

``--processes`` processes share one file; in each, ``--writers`` coroutines on one event loop
loop for ``--seconds``: wait for the lock (``BEGIN IMMEDIATE`` through the async store's
:func:`~retrysafe.stores.sqlite.retry_while_busy`), hold it for a random 0 to ``--hold``
seconds (a transactional handler that sleeps after its write), commit, pause a little. It
prints the waits' p50, p99 and max for ``racing`` (every waiter retries on its own, as before
turns) and ``turns`` (the waiters of one loop take turns; only the head polls). Nothing is
asserted; numbers depend on the machine and its load.

    .venv/bin/python bench/sqlite_lock_turns.py --processes 3 --writers 4 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from retrysafe.stores.sqlite import retry_while_busy


async def _writer(path: str, turns: bool, hold: float, until: float, waits: list[float]) -> None:
    conn = sqlite3.connect(path, isolation_level=None, timeout=0, check_same_thread=False)
    rng = random.Random()
    loop = asyncio.get_running_loop()
    while loop.time() < until:
        asked = loop.time()
        await retry_while_busy(
            lambda: conn.execute("BEGIN IMMEDIATE"),
            busy_timeout=60.0,
            what="begin",
            path=path if turns else None,
        )
        waits.append(loop.time() - asked)
        conn.execute("INSERT INTO work (n) VALUES (1)")
        await asyncio.sleep(rng.uniform(0, hold))
        conn.execute("COMMIT")
        await asyncio.sleep(rng.uniform(0.0, 0.05))
    conn.close()


async def _process(path: str, turns: bool, writers: int, hold: float, seconds: float) -> None:
    waits: list[float] = []
    until = asyncio.get_running_loop().time() + seconds
    await asyncio.gather(*(_writer(path, turns, hold, until, waits) for _ in range(writers)))
    print(json.dumps(waits))


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--hold", type=float, default=0.3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        path, mode = args.child
        asyncio.run(_process(path, mode == "turns", args.writers, args.hold, args.seconds))
        return
    for mode in ("racing", "turns"):
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "lock.db")
            setup = sqlite3.connect(path, isolation_level=None)
            setup.execute("PRAGMA journal_mode = WAL")
            setup.execute("CREATE TABLE work (n INTEGER)")
            setup.close()
            argv = [sys.executable, __file__, "--child", path, mode]
            argv += ["--writers", str(args.writers), "--hold", str(args.hold)]
            argv += ["--seconds", str(args.seconds)]
            started = time.monotonic()
            children = [
                subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
                for _ in range(args.processes)
            ]
            waits = [w for child in children for w in json.loads(child.communicate()[0])]
            took = time.monotonic() - started
        print(
            f"{mode:7} acquisitions={len(waits)} ({len(waits) / took:.1f}/s) "
            f"wait p50={_quantile(waits, 0.5):.2f}s p99={_quantile(waits, 0.99):.2f}s "
            f"max={max(waits):.2f}s"
        )


if __name__ == "__main__":
    main()
