"""Huey tasks whose effect happens once per business key, across duplicate enqueues, retries and
consumers killed mid-task: a decorator under ``@huey.task()``::

    from huey import RedisHuey
    from retrysafe.contrib.huey import idempotent_task

    huey = RedisHuey("shop")

    @huey.task(retries=3)
    @idempotent_task(huey, store="postgresql://localhost/shop", key="order_id", lease=10)
    def charge(order_id: str, amount: int) -> dict:
        ...

    charge("o-1", 100)                       # or charge("o-1", 100, idempotency_key="o-1")

The key is, in this order: an ``idempotency_key=`` keyword argument, the decorator's ``key=``
(a parameter name or a callable over the arguments), else the task's id (the same for every
retry of one task).

Each task: the first runs the function and stores its result (its lease renewed while it runs);
a task whose key is complete returns the stored result without running (its caller's
``result()`` is the first run's); one that finds a live consumer running the key raises Huey's
``RetryTask`` with a delay of a few seconds (the same task, its id and result handle, comes back
later; Huey does not count it against ``retries``), never runs and is never dropped; one that
finds a dead consumer's key takes it over and runs.

Huey takes a task off the queue before it runs it and has no acknowledgement. On Huey's Redis
storages, while a keyed task runs its message is kept in a Redis hash beside Huey's queue
(``huey.retrysafe.running.<name>``) with its consumer's heartbeat (a key renewed every
``heartbeat / 3`` seconds by a thread of each consumer process, lapsing ``heartbeat`` seconds
after the process dies), and removed when the task ends (success, final failure, or once Huey
has scheduled its retry). The same thread sweeps the hash at the consumer's start and every
``heartbeat / 3`` seconds: a task whose consumer's heartbeat lapsed is enqueued again (one
sweeper claims it atomically), and its copy takes the dead consumer's key over and runs once, or
is answered from the stored result if the first run had finished. A live consumer keeps its
heartbeat however long its task runs, so its task is never enqueued again. The consumer's start
(``on_startup``) warns where Huey's settings lose results or killed tasks.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, Unpack

from .._core.errors import ConfigurationError
from ..calls import FunctionOptions, IdempotentFunction, task_function, warn_once
from ..stores import Store
from ._extra import extra

with extra("huey"):
    from huey import Huey, signals
    from huey.exceptions import RetryTask
    from huey.storage import BlackHoleStorage, MemoryStorage, RedisStorage

__all__ = ["HEARTBEAT", "check_huey", "idempotent_task"]

logger = logging.getLogger("retrysafe.huey")

P = ParamSpec("P")
R = TypeVar("R")

#: Seconds after a consumer process dies until its running tasks are enqueued again (at most
#: a third more, the sweep's period).
HEARTBEAT = 10.0

#: Per worker thread: the task it runs now (set by the ``pre_execute`` hook), the running entry
#: it wrote for it, and the entry of a task Huey is about to schedule again.
_running = threading.local()
_hooked: dict[int, list[IdempotentFunction[..., Any]]] = {}
_kept: dict[int, _Running | None] = {}

# Take a dead consumer's entry over: only while its heartbeat is gone and the entry unchanged,
# so of several sweepers one enqueues it, and a consumer that beat again keeps it.
_CLAIM = """
if redis.call('exists', KEYS[2]) == 1 then return 0 end
if redis.call('hget', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('hset', KEYS[1], ARGV[1], ARGV[3])
return 1
"""
# Remove an entry only if it is still the one written: a copy of the same task (same id) that
# started since wrote its own.
_DROP = """
if redis.call('hget', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('hdel', KEYS[1], ARGV[1])
end
return 0
"""
_OWNER = 32  # an entry is its consumer's id (32 hex digits), then Huey's message


def idempotent_task(
    huey: Huey,
    /,
    *,
    store: str | Store,
    heartbeat: float = HEARTBEAT,
    **options: Unpack[FunctionOptions],
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Make a Huey task's function run once per key; put it under ``@huey.task()``.

    Args:
        huey: the Huey instance the task is registered on (its ``pre_execute``,
            ``post_execute`` and ``on_startup`` hooks and a ``scheduled`` signal handler are
            added once).
        store: a store URL or a synchronous store: every consumer must share it.
        heartbeat: seconds after a consumer process dies until a live consumer enqueues its
            running tasks again (Huey's Redis storages; 1 or more, the same for every task of
            one Huey).
        **options: :class:`~retrysafe.calls.FunctionOptions`, as
            :func:`~retrysafe.idempotent_function` takes them: ``key`` (a parameter name,
            several, or a callable over the arguments; an ``idempotency_key=`` argument wins;
            without any, the task's id), ``name`` (default: the function's module and qualified
            name), ``fingerprint``, ``codec``, ``final``, ``config`` or the call options
            (``ttl``: longer than any re-enqueue; ``lease``: how long a copy waits out a dead
            consumer's key, so about ``heartbeat``; ``on_store_error``, ``transactional``,
            ``on_event``).

    Raises:
        ConfigurationError: a bad option, named (at import, in producers and consumers alike).
    """

    def decorate(target: Callable[P, R]) -> Callable[P, R]:
        where = f"idempotent_task({getattr(target, '__qualname__', target)})"
        keyed = task_function(target, store, options, where=where)
        _hook(huey, heartbeat, where).append(keyed)

        @functools.wraps(target)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            task = getattr(_running, "task", None)
            if task is None:  # called directly (or by Huey's immediate mode without hooks)
                return keyed(*args, **kwargs)  # type: ignore[no-any-return]
            kept = _kept.get(id(huey))
            if kept is not None and not huey.immediate:
                _running.entry = kept.enter(task)
            delivery = keyed.deliver(args, kwargs, fallback=task.id, queue=True)
            if delivery.dead_letter and delivery.error is not None:
                raise delivery.error  # the task fails, for a person to look at
            if not delivery.retry:
                return delivery.result  # type: ignore[no-any-return]
            # A live consumer runs the first copy, or the store failed: this task comes back
            # later (Huey's RetryTask leaves its retries alone), never runs now.
            raise RetryTask(delay=delivery.retry_after or 1)

        run.retrysafe = keyed  # type: ignore[attr-defined]
        return run

    return decorate


class _Running:
    """The keyed tasks running on one Huey's Redis storage, each with its consumer process's
    heartbeat. A thread per consumer process renews the heartbeat and sweeps: a thread, not a
    Huey periodic task, because the heartbeat must go on while every worker is busy (a periodic
    task waits for a free worker, runs at most once a minute and not at all under
    ``--no-periodic``), and the sweep rides along."""

    def __init__(self, huey: Huey, heartbeat: float) -> None:
        storage = huey.storage
        self.huey = huey
        self.heartbeat = heartbeat
        self.conn = storage.conn
        self.key = f"huey.retrysafe.running.{storage.name}"
        self.alive = f"huey.retrysafe.alive.{storage.name}."
        self._claim = self.conn.register_script(_CLAIM)
        self._drop = self.conn.register_script(_DROP)
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._pid = 0
        self.owner = b""

    def start(self) -> None:
        """Beat and start the thread, once per process (a forked worker process starts its
        own). The first beat is written before any entry, so no sweeper takes a live task."""
        with self._lock:
            if self._pid == os.getpid():
                return
            self.owner = uuid.uuid4().hex.encode()
            self._beat()
            self._pid = os.getpid()
        threading.Thread(target=self._keep, name="retrysafe-huey", daemon=True).start()

    def _beat(self) -> None:
        self.conn.set(self.alive + self.owner.decode(), b"1", px=int(self.heartbeat * 1000))

    def stop(self) -> None:
        """End this process's thread: its heartbeat lapses, and its running tasks are
        enqueued again by the others (what a killed consumer leaves)."""
        self._stopped.set()

    def _keep(self) -> None:
        pid = os.getpid()
        while self._pid == pid and not self._stopped.is_set():
            try:
                self.sweep()
                if self._stopped.wait(self.heartbeat / 3):
                    return
                self._beat()
            except Exception:  # Redis away: Huey's own workers wait for it too
                logger.exception("retrysafe: the Huey heartbeat or sweep failed")
                time.sleep(1)

    def enter(self, task: Any) -> tuple[str, bytes] | None:
        """Keep ``task``'s message while it runs (``None``: Redis refused, the task runs
        without)."""
        try:
            self.start()
            entry = (task.id, self.owner + self.huey.serialize_task(task))
            self.conn.hset(self.key, *entry)
        except Exception:
            logger.exception("retrysafe: task %s runs unkept (a kill now loses it)", task.id)
            return None
        return entry

    def leave(self, entry: tuple[str, bytes]) -> None:
        try:
            self._drop(keys=[self.key], args=list(entry))
        except Exception:  # left behind: enqueued again after this consumer, and answered
            logger.exception("retrysafe: task %s's running entry was not removed", entry[0])

    def sweep(self) -> int:
        """Enqueue again each task whose consumer's heartbeat lapsed; return how many."""
        found = 0
        for field, value in self.conn.hgetall(self.key).items():
            owner, message = value[:_OWNER], value[_OWNER:]
            if owner == self.owner:
                continue
            mine = self.owner + message
            alive = self.alive + owner.decode()
            if not self._claim(keys=[self.key, alive], args=[field, value, mine]):
                continue
            # Claimed: were this process killed now, the entry is its own and a later sweep
            # enqueues it. Enqueued, then dropped: a kill in between leaves one more copy, which
            # is answered from the store.
            try:
                priority = self.huey.deserialize_task(message).priority
            except Exception:  # a task this consumer does not know: its default priority
                priority = None
            self.huey.storage.enqueue(message, priority)
            self._drop(keys=[self.key], args=[field, mine])
            logger.warning(
                "retrysafe: task %s's consumer died (no heartbeat for %ss): enqueued again",
                field.decode(),
                self.heartbeat,
            )
            found += 1
        return found


def _hook(huey: Huey, heartbeat: float, where: str) -> list[IdempotentFunction[..., Any]]:
    """The idempotent tasks of ``huey``, its hooks added on the first."""
    if not heartbeat >= 1:
        raise ConfigurationError(f"{where}: heartbeat={heartbeat!r}: must be 1 second or more")
    keyed = _hooked.get(id(huey))
    if keyed is not None:
        kept = _kept.get(id(huey))
        if kept is not None and kept.heartbeat != heartbeat:
            raise ConfigurationError(
                f"{where}: heartbeat={heartbeat!r}: every idempotent task of Huey "
                f"{huey.name} must give the same (an earlier one gave {kept.heartbeat!r})"
            )
        return keyed
    keyed = _hooked[id(huey)] = []
    kept = _kept[id(huey)] = (
        _Running(huey, heartbeat) if isinstance(huey.storage, RedisStorage) else None
    )

    def started(task: Any) -> None:
        _running.task = task
        _running.entry = _running.retried = None

    def ended(task: Any, value: Any, exception: Any) -> None:
        entry, _running.task, _running.entry = getattr(_running, "entry", None), None, None
        if entry is None or kept is None:
            return
        if exception is not None and task.retries:
            # Huey puts the task back only after this hook: the entry stays until it is
            # scheduled (below), or until its immediate retry starts and writes its own.
            _running.retried = entry
        else:
            kept.leave(entry)

    def scheduled(signal: str, task: Any, *args: Any) -> None:
        entry = getattr(_running, "retried", None)
        if entry is not None and kept is not None and entry[0] == task.id:
            _running.retried = None
            kept.leave(entry)

    def check() -> None:
        warn_once(check_huey(huey))
        if kept is not None:
            kept.start()  # the heartbeat, and a first sweep at once

    huey.pre_execute(name="retrysafe")(started)
    huey.post_execute(name="retrysafe")(ended)
    huey.signal(signals.SIGNAL_SCHEDULED)(scheduled)
    huey.on_startup(name="retrysafe")(check)
    return keyed


def check_huey(huey: Huey) -> list[str]:
    """What in ``huey``'s settings works against its idempotent tasks (run by each consumer at
    start, ``on_startup``)."""
    out: list[str] = []
    if not huey.results and _hooked.get(id(huey)):
        out.append(
            f"Huey {huey.name}: results=False: a copy of an idempotent task is answered with "
            "the first run's result, but no caller can read it; keep results=True"
        )
    storage = huey.storage
    if _hooked.get(id(huey)) and not isinstance(
        storage, (RedisStorage, MemoryStorage, BlackHoleStorage)
    ):
        out.append(
            f"Huey {huey.name}: {type(storage).__name__}: a consumer killed mid-task loses its "
            "idempotent tasks (retrysafe keeps them, and enqueues a dead consumer's again, on "
            "Huey's Redis storages only); use RedisHuey, or enqueue such a task again"
        )
    return out
