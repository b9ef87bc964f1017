# Generated from src/retrysafe/stores/redis/_client.py by scripts/unasync.py: do not edit.
"""The Redis stores' driver over a redis-py sync client: a user's own, or the cluster's.

This file is generated from ``_client.py`` by ``scripts/unasync.py`` (``make lint`` checks
that it is up to date): edit that file, then run the script.
"""

from __future__ import annotations

from typing import Any, TypeVar

from redis.exceptions import NoScriptError

from .._base import StoreStats
from ._commands import Call, Tally, Wait, now_ms
from ._redispy import client_errors, pipeline_sync

__all__ = ["ClientDriver"]

T = TypeVar("T")
#: Keys per SCAN and per pipeline of HMGETs when counting records.
_STATS_BATCH = 500


class ClientDriver:
    """Script calls on a redis-py sync client (``redis.Redis`` or ``RedisCluster``).

    Args:
        client: the client, created with ``decode_responses=False``.
        owned: the store made it (it closes it); a user's client is never closed here.
    """

    def __init__(self, client: Any, *, owned: bool) -> None:
        self.client = client
        self.owned = owned

    def perform(self, call: Call[T]) -> T:
        """Run one script call (``EVALSHA``, ``EVAL`` when the server lost the script)."""
        if call.wait is not None:
            return self._perform_acked(call, call.wait)
        script = call.script
        client = self.client
        with client_errors(script.name):
            try:
                reply = client.evalsha(script.sha, 1, *call.args)
            except NoScriptError:
                reply = client.eval(script.source, 1, *call.args)
        result: T = call.parse(reply, call)
        return result

    def _perform_acked(self, call: Call[T], wait: Wait) -> T:
        """The script and ``WAIT`` after it, pipelined on one connection of the key's master
        (see :class:`~retrysafe.stores.redis._commands.Wait`)."""
        script = call.script
        key = call.args[0]
        with client_errors(script.name):
            evalsha = ("EVALSHA", script.sha, 1, *call.args)
            reply, acked = pipeline_sync(self.client, key, [evalsha, wait.command])
            if isinstance(reply, NoScriptError):
                evaluate = ("EVAL", script.source, 1, *call.args)
                reply, acked = pipeline_sync(self.client, key, [evaluate, wait.command])
            if isinstance(reply, Exception):
                raise reply
        result: T = call.parse(reply, call)
        wait.check(reply, acked, script.name)
        return result

    def beat(self, key: str, ttl_ms: int) -> None:
        """Set a heartbeat key (the first beat; the heartbeat thread does the rest)."""
        with client_errors("heartbeat"):
            self.client.set(key, b"1", px=ttl_ms)

    def stats(self, pattern: str) -> StoreStats:
        """Count the records whose keys match ``pattern`` (a SCAN of every master; HMGETs
        pipelined)."""
        client = self.client
        with client_errors("stats"):
            tally = Tally(now_ms(client.time()))
            batch: list[Any] = []
            for name in client.scan_iter(match=pattern, count=_STATS_BATCH):
                batch.append(name)
                if len(batch) >= _STATS_BATCH:
                    tally.add(self._fields(batch))
                    batch = []
            if batch:
                tally.add(self._fields(batch))
        return tally.stats()

    def _fields(self, names: list[Any]) -> Any:
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            pipe.hmget(name, "s", "l", "x")
        return pipe.execute()

    def close(self) -> None:
        """Close the client if the store made it."""
        if self.owned:
            self.client.close()
