"""The in-repo load generator, used when ``wrk`` is missing: raw-socket HTTP/1.1 keep-alive.

No HTTP library: each connection writes one pre-built request, reads the response head, then
exactly ``Content-Length`` body bytes, and goes again. Run it pinned to the other core::

    python bench/loadgen.py --port 8101 --mode new --nonce abc --duration 5 --connections 16

It prints one line ``BENCH_JSON {...}`` with the same fields as ``bench/wrk.lua``. It is a
Python client, so on a fast endpoint it can be the bottleneck; ``wrk`` is preferred.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

BODY = b'{"item":"book","quantity":2}'


def build_request(port: int, key: str | None) -> bytes:
    """Return the bytes of one ``POST /orders`` with an optional Idempotency-Key."""
    lines = [
        b"POST /orders HTTP/1.1",
        b"Host: 127.0.0.1:" + str(port).encode(),
        b"Content-Type: application/json",
        b"Content-Length: " + str(len(BODY)).encode(),
    ]
    if key is not None:
        lines.append(b"Idempotency-Key: " + key.encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + BODY


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    if length:
        await reader.readexactly(length)
    return status


async def _worker(
    port: int,
    mode: str,
    nonce: str,
    wid: int,
    deadline: float,
    latencies: list[float],
    stats: dict[str, int],
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    fixed = build_request(port, nonce if mode == "replay" else None)
    counter = 0
    perf = time.perf_counter
    try:
        while perf() < deadline:
            if mode == "new":
                counter += 1
                request = build_request(port, f"{nonce}-{wid}-{counter}")
            else:
                request = fixed
            start = perf()
            writer.write(request)
            try:
                status = await _read_response(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                stats["errors_read"] += 1
                break
            latencies.append(perf() - start)
            stats["requests"] += 1
            if status >= 400:
                stats["errors_status"] += 1
    finally:
        writer.close()


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, round(q / 100 * (len(sorted_values) - 1)))
    return sorted_values[index]


async def run(port: int, mode: str, nonce: str, duration: float, connections: int) -> dict:
    """Drive the server for ``duration`` seconds; return wrk-like figures."""
    latencies: list[float] = []
    stats = {"requests": 0, "errors_read": 0, "errors_status": 0}
    start = time.perf_counter()
    deadline = start + duration
    await asyncio.gather(
        *(_worker(port, mode, nonce, wid, deadline, latencies, stats) for wid in range(connections))
    )
    elapsed = time.perf_counter() - start
    latencies.sort()
    us = 1e6
    return {
        "requests": stats["requests"],
        "duration_us": int(elapsed * us),
        "bytes": 0,
        "errors_connect": 0,
        "errors_read": stats["errors_read"],
        "errors_write": 0,
        "errors_status": stats["errors_status"],
        "errors_timeout": 0,
        "p50_us": int(_percentile(latencies, 50) * us),
        "p90_us": int(_percentile(latencies, 90) * us),
        "p99_us": int(_percentile(latencies, 99) * us),
        "mean_us": (sum(latencies) / len(latencies) * us) if latencies else 0.0,
        "max_us": int(latencies[-1] * us) if latencies else 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=("new", "replay", "nokey"), required=True)
    parser.add_argument("--nonce", default="bench")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--cpu", type=int, default=None)
    args = parser.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    coro = run(args.port, args.mode, args.nonce, args.duration, args.connections)
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(coro)
    else:
        result = uvloop.run(coro)
    print("BENCH_JSON " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
