# Generated from src/retrysafe/stores/redis/_async.py by scripts/unasync.py: do not edit.
"""The sync Redis stores (one server, and a cluster): the store's logic over a driver.

Each operation is a script call built by ``_commands.py`` and run by the driver
(``_client_sync.py``, over redis-py's client); a reservation that meets another
process's record runs the conflict handling through the one action loop. How a store connects
is ``_connect.py``'s.

This file is generated from ``_async.py`` by ``scripts/unasync.py`` (``make lint`` checks
that it is up to date): edit that file, then run the script.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol, TypeVar

from ..._core.drive_sync import drive
from ..._core.errors import ConfigurationError, StoreError
from ..._core.records import Record, Reservation, instance_id
from .._base import StoreStats
from .._url import StoreURL
from ._commands import (
    DEFAULT_HEARTBEAT,
    DEFAULT_PREFIX,
    DEFAULT_REPLICAS_TIMEOUT,
    Call,
    Commands,
    RedisURL,
    check_replicas,
    conflict_op,
    parse_cluster_url,
    parse_redis_url,
)
from ._connect import connect_cluster_sync, connect_sync
from ._heartbeat import Heartbeat, ThreadClient
from ._redispy import check_client

__all__ = ["RedisClusterStore", "RedisStore"]

T = TypeVar("T")


class _Driver(Protocol):
    """What a store needs of its driver (``_lean.py``, ``_client.py``)."""

    def perform(self, call: Call[T]) -> T: ...

    def beat(self, key: str, ttl_ms: int) -> None: ...

    def stats(self, pattern: str) -> StoreStats: ...

    def close(self) -> None: ...


def _own_options(
    url: str | StoreURL | None, client: Any, prefix: str | None
) -> tuple[RedisURL | None, str]:
    if (url is None) == (client is None):
        raise ConfigurationError("pass either a redis:// URL or a client, not both or neither")
    parsed = parse_redis_url(url) if url is not None else None
    if client is not None:
        check_client(client)
    if prefix is None:
        prefix = parsed.prefix if parsed is not None else DEFAULT_PREFIX
    return parsed, prefix


def _replicas(
    parsed: RedisURL | None, replicas: int | None, replicas_timeout: float | None
) -> tuple[int, float]:
    """The keywords over the URL's ``?replicas=`` / ``?replicas_timeout=``, checked."""
    if replicas is None:
        replicas = parsed.replicas if parsed is not None else 0
    if replicas_timeout is None:
        replicas_timeout = (
            parsed.replicas_timeout if parsed is not None else DEFAULT_REPLICAS_TIMEOUT
        )
    # A user's client has its own timeout, unknown here: only the URL's bounds the wait.
    check_replicas(replicas, replicas_timeout, parsed.timeout if parsed else float("inf"))
    return replicas, replicas_timeout


class RedisStore:
    """Keeps records in Redis; synchronous (WSGI, Django, scripts).

    Args:
        url: ``redis://`` / ``rediss://`` URL; the store creates its own redis-py client.
        client: instead of a URL, a redis-py client you own (``redis.Redis``
            or ``RedisCluster``, created with ``decode_responses=False``); never closed here.
        prefix: key prefix of every record (default: the URL's ``?prefix=``, else
            ``"retrysafe:"``).
        replicas: how many replicas must acknowledge a reservation, a completion or a commit
            mark (``WAIT``) before it counts as done; one they do not acknowledge in time fails
            with :class:`~retrysafe.StoreUnavailableError` (``503``). Default: the URL's
            ``?replicas=``, else 0 (no wait).
        replicas_timeout: seconds those writes wait (default: the URL's
            ``?replicas_timeout=``, else 0.5); less than the URL's ``?timeout=``.

    Raises:
        ConfigurationError: neither or both of ``url`` and ``client``, a bad URL, a client
            that decodes responses, or a bad ``replicas`` / ``replicas_timeout`` (named).
    """

    kind = "redis"
    #: Redis expires records by itself (key TTLs): ``purge_expired`` has nothing to do.
    expires_records = True

    def __init__(
        self,
        url: str | StoreURL | None = None,
        *,
        client: Any = None,
        prefix: str | None = None,
        replicas: int | None = None,
        replicas_timeout: float | None = None,
    ) -> None:
        parsed, prefix = _own_options(url, client, prefix)
        acks = _replicas(parsed, replicas, replicas_timeout)
        driver, thread = connect_sync(parsed, client)
        heartbeat = parsed.heartbeat if parsed is not None else DEFAULT_HEARTBEAT
        self._setup(driver, prefix, heartbeat, thread, acks)

    def _setup(
        self,
        driver: _Driver,
        prefix: str,
        heartbeat: float,
        thread: ThreadClient | None,
        acks: tuple[int, float],
    ) -> None:
        self.prefix = prefix
        #: Replicas that must acknowledge each reservation, completion and commit mark.
        self.replicas = acks[0]
        self._commands = Commands(prefix, *acks)
        self._driver = driver
        self._heartbeat: Heartbeat | None = None
        if heartbeat and thread is not None:
            self._heartbeat = Heartbeat(thread, self._commands.owner_key, heartbeat)
        # Concurrent first requests wait for one first beat (redis-py's async cluster client
        # fails commands sent while it opens a connection).
        self._heartbeat_starting = threading.Lock()

    @classmethod
    def from_url(cls, url: str | StoreURL) -> RedisStore:
        """Build from ``redis://host:port/db?prefix=retrysafe:&timeout=2``."""
        return cls(url)

    def reserve(self, record_id: str, fingerprint: str, *, lease: float, ttl: float) -> Reservation:
        """See :meth:`retrysafe.stores.Store.reserve`."""
        hb = self._heartbeat
        owned = hb is not None and (hb.fresh() or self._start_heartbeat(hb))
        claim = self._commands.claim(record_id, fingerprint, lease, ttl, owned)
        try:
            first = self._driver.perform(claim)
            if first[1] is None:
                return first[0]
            op = conflict_op(self._commands, claim, first, record_id, fingerprint, lease, ttl)
            return drive(op, self._driver)
        except BaseException:
            # No answer: the reservation may exist. A retry from here resumes it.
            self._commands.lost_claim(record_id, fingerprint, claim)
            raise

    def reserve_committed(
        self, record_id: str, fingerprint: str, *, lease: float, ttl: float
    ) -> tuple[Reservation, bool]:
        """:meth:`reserve`, and a won key is at once marked committed (as by
        :meth:`mark_committed` with ``lease``) in the same round trip. Returns the reservation
        and whether it was created committed (a key taken over from a dead owner is not: mark
        it as usual)."""
        hb = self._heartbeat
        owned = hb is not None and (hb.fresh() or self._start_heartbeat(hb))
        claim = self._commands.claim(record_id, fingerprint, lease, ttl, owned, committed=True)
        try:
            first = self._driver.perform(claim)
            if first[1] is None:
                return first[0], first[0].token is not None
            op = conflict_op(self._commands, claim, first, record_id, fingerprint, lease, ttl)
            return drive(op, self._driver), False
        except BaseException:
            self._commands.lost_claim(record_id, fingerprint, claim)
            raise

    def _start_heartbeat(self, hb: Heartbeat) -> bool:
        """Start this process's heartbeat: the first SET through the store's own driver, then
        the thread renews it. Once: concurrent first requests wait for it."""
        with self._heartbeat_starting:
            if hb.fresh():
                return True  # another request started it while this one waited
            instance = instance_id()
            at = time.monotonic()
            if at < hb.retry_at:
                return False
            try:
                self._driver.beat(*hb.first_beat())
            except StoreError as exc:
                hb.failed(at, exc)
                return False
            hb.started(instance, at)
            return hb.fresh()

    def renew(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.Store.renew`."""
        return self._driver.perform(self._commands.renew(record_id, token, lease))

    def mark_committed(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.Store.mark_committed`."""
        return self._driver.perform(self._commands.mark_committed(record_id, token, lease))

    def delete(self, record_id: str) -> bool:
        """See :meth:`retrysafe.stores.Store.delete`."""
        return self._driver.perform(self._commands.delete(record_id))

    def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """See :meth:`retrysafe.stores.Store.complete`."""
        return self._driver.perform(self._commands.complete(record_id, token, response, ttl))

    def release(self, record_id: str, token: str) -> bool:
        """See :meth:`retrysafe.stores.Store.release`."""
        return self._driver.perform(self._commands.release(record_id, token))

    def get(self, record_id: str) -> Record | None:
        """See :meth:`retrysafe.stores.Store.get`."""
        return self._driver.perform(self._commands.get(record_id))

    def purge_expired(self) -> int:
        """Return 0: Redis deletes expired records by itself (key TTLs)."""
        return 0

    def stats(self) -> StoreStats:
        """Count the records by state (see :class:`~retrysafe.stores.StoreStats`): one scan of
        the prefix, on the server's clock."""
        return self._driver.stats(self._commands.pattern())

    def close(self) -> None:
        """Stop the heartbeat and close the store's own connection (a user's client is left
        open)."""
        if self._heartbeat is not None:
            self._heartbeat.stop()
        self._driver.close()


class RedisClusterStore(RedisStore):
    """Keeps records in a Redis Cluster; synchronous (WSGI, Django, scripts).

    The client is redis-py's ``redis.cluster.RedisCluster``.

    Args:
        url: ``redis+cluster://host:port,host:port?prefix=...`` (or ``rediss+cluster://``).
        replicas: how many replicas of a slot's master must acknowledge a reservation, a
            completion or a commit mark (see :class:`RedisStore`; default: the URL's
            ``?replicas=``, else 0).
        replicas_timeout: seconds those writes wait (default: ``?replicas_timeout=``, else 0.5).

    Raises:
        ConfigurationError: a bad URL, or a bad ``replicas`` / ``replicas_timeout`` (named).
    """

    def __init__(
        self,
        url: str | StoreURL,
        *,
        replicas: int | None = None,
        replicas_timeout: float | None = None,
    ) -> None:
        parsed = parse_cluster_url(url)
        acks = _replicas(parsed.options, replicas, replicas_timeout)
        driver, thread = connect_cluster_sync(parsed)
        self._setup(driver, parsed.options.prefix, parsed.options.heartbeat, thread, acks)

    @classmethod
    def from_url(cls, url: str | StoreURL) -> RedisClusterStore:
        """Build from ``redis+cluster://host:port,host:port?prefix=...``."""
        return cls(url)
