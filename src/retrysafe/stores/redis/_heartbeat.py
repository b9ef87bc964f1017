"""Owner liveness on Redis: this process's heartbeat key, renewed by a daemon thread.

Hand-written once for both faces: the thread is the point (see :class:`Heartbeat`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..._core.records import instance_id
from .._fork import reset_after_fork
from ._commands import ms
from ._redispy import CLIENT_ERRORS

__all__ = ["Heartbeat", "ThreadClient"]

logger = logging.getLogger("retrysafe.stores.redis")

#: Renewals per heartbeat TTL (one SET every TTL / 5 = 1 s by default).
_BEATS_PER_TTL = 5


@dataclass(frozen=True, slots=True)
class ThreadClient:
    """The synchronous client the heartbeat thread uses.

    Attributes:
        make: builds it (or hands out one the store shares).
        close: the thread closes it when it ends (its own; never a shared one).
    """

    make: Callable[[], Any]
    close: bool


class Heartbeat:
    """This process's heartbeat key on one Redis, renewed by a daemon thread.

    A thread, not the event loop: a loop stalled by CPU-bound work in a live process keeps
    beating (the thread gets the GIL at every switch interval). The key is
    ``retrysafe-owner:<prefix><instance id>`` with a TTL of ``ttl`` seconds, set again every
    ``ttl / 5`` seconds. The store sets it the first time, on its own connection (so the event
    loop never blocks), then calls :meth:`started`. Tokens name this process only while the last
    successful beat is recent enough that the key surely exists. After ``fork`` the child (new
    instance id, no thread) starts its own.

    Args:
        client: the thread's client.
        key_of: the heartbeat key of an instance id.
        ttl: the key's TTL in seconds.
    """

    def __init__(self, client: ThreadClient, key_of: Callable[[str], str], ttl: float) -> None:
        self._client = client
        #: Monotonic time before which a failed start is not tried again.
        self.retry_at = 0.0
        self._key_of = key_of
        self.ttl = ttl
        self.instance = ""
        self._beat_at = float("-inf")
        self._stop = threading.Event()
        self._lock = threading.Lock()
        #: Successful renewals since start (the measured cost: beats per second).
        self.beats = 0
        reset_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child (no thread, a new instance id): a new lock, so that the child's
        first beat starts its own thread even if the parent's lock was held at the fork."""
        self._lock = threading.Lock()

    def fresh(self) -> bool:
        """Whether tokens may name this process now (its heartbeat key exists)."""
        return (
            self.instance == instance_id()
            and time.monotonic() - self._beat_at < self.ttl * 0.6
            and not self._stop.is_set()
        )

    def first_beat(self) -> tuple[str, int]:
        """(key, TTL in ms) of the SET that starts this process's heartbeat."""
        return self._key_of(instance_id()), ms(self.ttl)

    def failed(self, at: float, exc: BaseException) -> None:
        """The first SET (sent at monotonic time ``at``) failed: try again in a few seconds."""
        self.retry_at = at + 5.0
        logger.warning("owner liveness off for now (heartbeat failed): %s", exc)

    def started(self, instance: str, at: float) -> None:
        """A SET by the caller (sent at monotonic time ``at``) succeeded: run the thread."""
        with self._lock:
            if self._stop.is_set() or instance != instance_id():
                return
            if self.instance == instance:
                self._beat_at = max(self._beat_at, at)
                return
            self.instance = instance
            self._beat_at = at
            thread = threading.Thread(
                target=self._run, args=(instance,), name="retrysafe-heartbeat", daemon=True
            )
            thread.start()

    def _run(self, instance: str) -> None:
        client = self._client.make()
        key = self._key_of(instance)
        interval = self.ttl / _BEATS_PER_TTL
        try:
            while not self._stop.wait(interval) and self.instance == instance:
                at = time.monotonic()
                try:
                    client.set(key, b"1", px=ms(self.ttl))
                except CLIENT_ERRORS as exc:
                    logger.warning("Redis heartbeat failed: %s", exc)
                    continue
                if self.instance == instance:
                    self._beat_at = at
                    self.beats += 1
        finally:
            if self._client.close:
                client.close()

    def stop(self) -> None:
        """Stop renewing (the key lapses within its TTL; it is never deleted here, since
        another store of this process may share it)."""
        self._stop.set()
