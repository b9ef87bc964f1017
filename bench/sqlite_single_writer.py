"""What SQLite's single writer means for a transactional handler, measured.

Serves OrderHub (``retrysafe demo``, SQLite store, orders in the same file: transactional mode)
in a real uvicorn process and, for ``--hold`` seconds, keeps ``--clients`` clients busy with
each kind of request while one request holds the write lock:

- ``new key``: ``POST /payments`` with a fresh key (a reservation, then a write);
- ``no key``: ``POST /orders`` without a key (a write of OrderHub's own);
- ``replay``: ``POST /payments`` with a completed key (answered from a read);
- ``duplicate``: the holder's own key again (answered 409 from a read).

Three windows, each ``--hold`` seconds: ``baseline`` (no holder), ``sleep before write`` (the
holder sleeps before its first write, ``?delay_ms=``: no lock held while it waits) and
``sleep after write`` (``?delay_after_ms=``: the lock is held from the write to the commit).
It prints, per window and kind, how many requests were answered inside the window per second,
and the longest wait of any answer. Nothing is asserted; numbers depend on the machine.

    .venv/bin/python bench/sqlite_single_writer.py --hold 3 --clients 4
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path

import httpx

PAYMENT = {"amount": 5, "currency": "EUR"}
KINDS = ("new key", "no key", "replay", "duplicate")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _serve(path: Path, port: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "retrysafe", "demo", "--port", str(port)]
    cmd += ["--store", f"sqlite:///{path}", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/orders?limit=0", timeout=1)
            return proc
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("the demo did not start")


async def _window(
    client: httpx.AsyncClient, holder_query: str | None, hold: float, clients: int
) -> tuple[float, dict[str, tuple[int, dict[int, int], float]]]:
    """Run one window; return its span and {kind: (answered in it, statuses, longest wait)}."""
    replay_key = f'"replay-{uuid.uuid4()}"'
    first = await client.post("/payments", json=PAYMENT, headers={"Idempotency-Key": replay_key})
    assert first.status_code == 201, first.text
    holder_key = f'"holder-{uuid.uuid4()}"'
    holder_url = f"/payments?{holder_query}" if holder_query else "/payments"
    holder: asyncio.Task[httpx.Response] | None = None
    if holder_query:
        holder = asyncio.create_task(
            client.post(holder_url, json=PAYMENT, headers={"Idempotency-Key": holder_key})
        )
        await asyncio.sleep(0.2)  # the holder has started (and, after a write, holds the lock)
    start = time.monotonic()
    end = start + hold
    # Counted: answers that arrived while the holder was still running (all of the window
    # without a holder). Its commit frees the queued writes, which then all arrive at once.
    cutoff = {"at": end}
    if holder is not None:
        holder.add_done_callback(lambda _: cutoff.update(at=min(end, time.monotonic())))
    answered: dict[str, int] = defaultdict(int)
    statuses: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    longest: dict[str, float] = defaultdict(float)

    async def one(kind: str) -> None:
        while time.monotonic() < end:
            sent = time.monotonic()
            if kind == "new key":
                headers = {"Idempotency-Key": f'"{uuid.uuid4()}"'}
                answer = await client.post("/payments", json=PAYMENT, headers=headers)
            elif kind == "no key":
                answer = await client.post("/orders", json={"item": "tea", "quantity": 1})
            elif kind == "replay":
                headers = {"Idempotency-Key": replay_key}
                answer = await client.post("/payments", json=PAYMENT, headers=headers)
            else:
                headers = {"Idempotency-Key": holder_key}
                answer = await client.post(holder_url, json=PAYMENT, headers=headers)
            now = time.monotonic()
            longest[kind] = max(longest[kind], now - sent)
            statuses[kind][answer.status_code] += 1
            if now < cutoff["at"]:
                answered[kind] += 1

    kinds = KINDS if holder_query else KINDS[:3]
    await asyncio.gather(*(one(kind) for kind, _ in itertools.product(kinds, range(clients))))
    if holder is not None:
        await holder
    span = cutoff["at"] - start
    return span, {k: (answered[k], dict(statuses[k]), longest[k]) for k in kinds}


async def _main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        port = _free_port()
        proc = _serve(Path(tmp) / "bench.db", port)
        ms = int(args.hold * 1000)
        windows = [
            ("baseline", None),
            ("sleep before write", f"delay_ms={ms}"),
            ("sleep after write", f"delay_after_ms={ms}"),
        ]
        limits = httpx.Limits(max_connections=4 * args.clients + 4)
        try:
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", timeout=120, limits=limits
            ) as client:
                print(f"hold {args.hold:g} s, {args.clients} clients per kind, one uvicorn process")
                print(
                    "| window | kind | answered/s while the holder ran | statuses | longest wait |"
                )
                print("|---|---|---|---|---|")
                for label, query in windows:
                    span, result = await _window(client, query, args.hold, args.clients)
                    for kind, (count, statuses, longest) in result.items():
                        rate = count / span
                        print(f"| {label} | {kind} | {rate:.0f} | {statuses} | {longest:.2f} s |")
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hold", type=float, default=3.0, help="seconds the lock is held")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients per kind")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
