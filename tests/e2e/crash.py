"""The crash-suite driver: many logical operations against several OrderHub processes while a
chaos task SIGKILLs and restarts them; then every operation's orders are counted.

Each operation has one key and one item name, and is retried with the same key (the identical
request) until it gets a final answer: ``201`` (first or replay) or ``409``
``idempotency-outcome-unknown``. Attempts use random client timeouts (lost responses),
concurrent duplicates and a share of ``delay_after_ms`` (the window between the effect and its
record, where a kill hurts most).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import httpx

from .servers import DemoServer

__all__ = ["CrashPlan", "CrashReport", "run_crash_suite"]


@dataclass(frozen=True)
class CrashPlan:
    """How hard to shake the service."""

    operations: int = 60
    concurrency: int = 12
    kills: int = 3
    kill_interval: tuple[float, float] = (1.0, 2.5)
    delay_after_share: float = 0.4
    duplicate_share: float = 0.3
    timeouts: tuple[float, ...] = (0.25, 0.8, 5.0)
    operation_deadline: float = 90.0
    seed: int = 0
    #: Spread the kills over the operations instead of timing them by ``kill_interval``: the
    #: n-th of k kills as soon as n/(k+1) of the operations have begun, a killed process
    #: restarted beside the run (the next kill does not wait for it). A run that ends sooner
    #: than k timed kills (a fast store: 300 operations in a few seconds, each timed kill
    #: followed by seconds of restart) still gets all k, every one with operations in flight.
    paced: bool = False


@dataclass
class CrashReport:
    """What happened."""

    operations: int = 0
    created: int = 0
    unknown: int = 0
    unfinished: int = 0
    unexpected: list[str] = field(default_factory=list)
    duplicates: int = 0
    lost: int = 0
    replay_mismatches: int = 0
    orders: int = 0
    attempts: int = 0
    replays: int = 0
    conflicts: int = 0
    unavailable: int = 0
    network_errors: int = 0
    kills: int = 0
    service_faults: int = 0
    seconds: float = 0.0
    #: Seconds from each operation's first attempt to its final answer.
    latencies: list[float] = field(default_factory=list)
    #: The slowest operations: (seconds, key, query, wall clock of the first attempt, their
    #: attempts), slowest first.
    slowest: list[tuple[float, str, str, float, list[str]]] = field(default_factory=list)

    def timelines(self) -> str:
        """The slowest operations attempt by attempt: when each began (seconds after the
        operation's first attempt), on which server, with which client timeout, what came back
        and when; for finding where a latency tail goes."""
        lines = []
        for seconds, key, query, started_at, attempts in self.slowest:
            lines.append(f"  {seconds:.2f}s {key}{query or ''} from {started_at:.3f}")
            lines.extend(f"    {line}" for line in attempts)
        return "\n".join(lines)

    def percentile(self, q: float) -> float:
        """The ``q`` quantile (0..1) of the operation latencies (nearest rank), 0 if none."""
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]

    def summary(self) -> str:
        """One line for the test log."""
        return (
            f"ops={self.operations} created={self.created} unknown={self.unknown} "
            f"unfinished={self.unfinished} orders={self.orders} duplicates={self.duplicates} "
            f"lost={self.lost} replay_mismatches={self.replay_mismatches} "
            f"attempts={self.attempts} replays={self.replays} 409={self.conflicts} "
            f"503={self.unavailable} net_errors={self.network_errors} kills={self.kills} "
            f"service_faults={self.service_faults} unexpected={len(self.unexpected)} "
            f"p50={self.percentile(0.5):.2f}s p99={self.percentile(0.99):.2f}s "
            f"p99.9={self.percentile(0.999):.2f}s max={self.percentile(1.0):.2f}s "
            f"in {self.seconds:.1f}s"
        )


@dataclass
class _Op:
    key: str
    item: str
    query: str
    bodies: list[bytes] = field(default_factory=list)
    final: str = ""
    attempts: list[str] = field(default_factory=list)
    seconds: float = 0.0
    started_at: float = 0.0  # wall clock of the first attempt


async def _operation(
    op: _Op,
    servers: Sequence[DemoServer],
    client: httpx.AsyncClient,
    rng: random.Random,
    plan: CrashPlan,
    report: CrashReport,
) -> None:
    payload = json.dumps({"item": op.item, "quantity": 1}).encode()
    headers = {"Idempotency-Key": op.key, "Content-Type": "application/json"}
    began = time.monotonic()
    op.started_at = time.time()
    deadline = began + plan.operation_deadline

    async def attempt() -> tuple[int, bytes, httpx.Headers] | None:
        server = rng.choice(servers)
        report.attempts += 1
        timeout = rng.choice(plan.timeouts)
        sent = time.monotonic()
        where = f"+{sent - began:.2f}s :{server.port} timeout={timeout:g}"
        try:
            response = await client.post(
                f"{server.url}/orders{op.query}",
                content=payload,
                headers=headers,
                timeout=timeout,
            )
        except httpx.HTTPError as exc:
            report.network_errors += 1
            op.attempts.append(f"{where} {type(exc).__name__} after {time.monotonic() - sent:.2f}s")
            return None
        answer = f"{response.status_code} retry-after={response.headers.get('retry-after')}"
        if response.headers.get("idempotency-replayed") == "true":
            answer += " replayed"
        op.attempts.append(f"{where} {answer} after {time.monotonic() - sent:.2f}s")
        return response.status_code, response.content, response.headers

    while time.monotonic() < deadline:
        copies = 2 if rng.random() < plan.duplicate_share else 1
        for result in await asyncio.gather(*(attempt() for _ in range(copies))):
            if result is None:
                continue
            status, body, response_headers = result
            if status == 201:
                op.bodies.append(body)
                if response_headers.get("idempotency-replayed") == "true":
                    report.replays += 1
                op.final = op.final or "created"
            elif status == 409:
                report.conflicts += 1
                if json.loads(body)["type"].endswith("idempotency-outcome-unknown"):
                    op.final = op.final or "unknown"
            elif status == 503:
                report.unavailable += 1
            else:
                report.unexpected.append(f"{op.key}: {status} {body[:200]!r}")
                op.final = op.final or "unexpected"
        if op.final:
            op.seconds = time.monotonic() - began
            report.latencies.append(op.seconds)
            return
        await asyncio.sleep(rng.uniform(0.05, 0.3))


class _Progress:
    """What the chaos task waits for: operations begun, the run's end, a process back up."""

    def __init__(self) -> None:
        self.begun = 0
        self.ended = asyncio.Event()
        self.changed = asyncio.Condition()

    async def note(self, *, begun: int = 0, ended: bool = False) -> None:
        async with self.changed:
            self.begun += begun
            if ended:
                self.ended.set()
            self.changed.notify_all()

    async def until(self, begun: int, ready: Callable[[], bool]) -> None:
        """Until ``begun`` operations have begun and ``ready()``, or the run has ended."""
        async with self.changed:
            await self.changed.wait_for(
                lambda: self.ended.is_set() or (self.begun >= begun and ready())
            )


async def _chaos(
    servers: Sequence[DemoServer],
    rng: random.Random,
    plan: CrashPlan,
    report: CrashReport,
    progress: _Progress,
    fault: Callable[[int], Awaitable[None]] | None,
) -> None:
    down: set[int] = set()  # indexes of the servers a paced run is restarting
    restarts: list[asyncio.Task[None]] = []

    async def restart(index: int, pause: float) -> None:
        await asyncio.sleep(pause)
        await asyncio.to_thread(servers[index].start)
        down.discard(index)
        await progress.note()

    for n in range(plan.kills):
        if plan.paced:
            due = (n + 1) * plan.operations // (plan.kills + 1)
            await progress.until(due, lambda: len(down) < len(servers))  # one is up
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(progress.ended.wait(), rng.uniform(*plan.kill_interval))
        if progress.ended.is_set():
            break
        if fault is not None and n % 3 == 2:
            await fault(n)  # a store-side fault (database or Redis restart) instead of a kill
            report.service_faults += 1
            continue
        index = rng.choice([i for i in range(len(servers)) if i not in down])
        await asyncio.to_thread(servers[index].kill)
        report.kills += 1
        pause = rng.uniform(0.1, 0.8)
        if plan.paced:
            down.add(index)
            restarts.append(asyncio.create_task(restart(index, pause)))
        else:
            await asyncio.sleep(pause)
            await asyncio.to_thread(servers[index].start)
    await asyncio.gather(*restarts)


async def run_crash_suite(
    servers: Sequence[DemoServer],
    plan: CrashPlan,
    *,
    fault: Callable[[int], Awaitable[None]] | None = None,
) -> CrashReport:
    """Run the plan against started servers and count every operation's orders.

    Args:
        servers: started demo processes sharing one store and one database.
        plan: the load and the chaos.
        fault: an extra store-side fault the chaos task triggers every third time.

    Returns:
        The report; the caller asserts what its mode guarantees.
    """
    rng = random.Random(plan.seed)
    report = CrashReport(operations=plan.operations)
    run = uuid.uuid4().hex[:8]
    ops = [
        _Op(
            key=f"crash-{run}-{i}",
            item=f"crash-{run}-{i}",
            query=f"?delay_after_ms={rng.randint(200, 900)}"
            if rng.random() < plan.delay_after_share
            else "",
        )
        for i in range(plan.operations)
    ]
    started = time.monotonic()
    progress = _Progress()
    limits = httpx.Limits(max_connections=plan.concurrency * 2 + 4)
    async with httpx.AsyncClient(limits=limits) as client:
        chaos = asyncio.create_task(_chaos(servers, rng, plan, report, progress, fault))
        gate = asyncio.Semaphore(plan.concurrency)

        async def guarded(op: _Op) -> None:
            async with gate:
                await progress.note(begun=1)
                await _operation(op, servers, client, rng, plan, report)

        await asyncio.gather(*(guarded(op) for op in ops))
        await progress.note(ended=True)
        await chaos
        for server in servers:  # every process is up again before counting
            if server.proc is None or server.proc.poll() is not None:
                await asyncio.to_thread(server.start)
        listing = (await client.get(servers[0].url + "/orders", timeout=30)).json()
    per_item = Counter(order["item"] for order in listing["orders"])
    slow = sorted(ops, key=lambda op: op.seconds, reverse=True)[:5]
    report.slowest = [(op.seconds, op.key, op.query, op.started_at, op.attempts) for op in slow]
    report.seconds = time.monotonic() - started
    for op in ops:
        count = per_item.get(op.item, 0)
        report.orders += count
        if op.final == "created":
            report.created += 1
            if count == 0:
                report.lost += 1
            if len(set(op.bodies)) != 1:
                report.replay_mismatches += 1
        elif op.final == "unknown":
            report.unknown += 1
        elif not op.final:
            report.unfinished += 1
        if count > 1:
            report.duplicates += count - 1
    return report
