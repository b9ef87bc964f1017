"""redis-py for the Redis stores: its errors as store errors, and the clients the store builds
(from a URL, for a cluster, lazily)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import redis as redis_py
from redis.backoff import NoBackoff
from redis.exceptions import AskError, RedisClusterException, RedisError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from ..._core.errors import ConfigurationError, StoreError, StoreUnavailableError
from .._fork import INHERITED, reset_after_fork
from .._loops import close_with_loop
from ._commands import STORE, ClusterURL, RedisURL, reply_error

__all__ = [
    "CLIENT_ERRORS",
    "LazyCluster",
    "LoopCluster",
    "async_cluster",
    "check_client",
    "client_errors",
    "pipeline_async",
    "pipeline_sync",
    "redis_py_error",
    "sync_client",
]

#: What redis-py raises: its errors, socket errors, and the cluster client's own (which is not a
#: RedisError: "cannot be connected", no slot map...).
CLIENT_ERRORS = (RedisError, OSError, RedisClusterException)


def redis_py_error(exc: Exception, what: str) -> StoreError:
    """A redis-py error as a store error: refused, lost or timed out -> unavailable (``503``)."""
    if isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError | RedisClusterException):
        message = f"Redis {what} failed: {type(exc).__name__}: {exc}"
        return StoreUnavailableError(message, store=STORE)
    return reply_error(exc, what)


@contextlib.contextmanager
def client_errors(what: str) -> Iterator[None]:
    """redis-py's errors as store errors; a failure inside the client (not one of its errors)
    as the store being unavailable too: seen with redis-py 8.1's async cluster client under
    timeouts during a failover ("'NoneType' object has no attribute 'writelines'" from a
    connection it had reset). A 503, never the app's 500."""
    try:
        yield
    except CLIENT_ERRORS as exc:
        raise redis_py_error(exc, what) from exc
    except Exception as exc:
        raise StoreUnavailableError(
            f"Redis {what} failed in the client: {type(exc).__name__}: {exc}", store=STORE
        ) from exc


#: Tries of a script and its ``WAIT`` on a slot's master that meet a redirection (the slot
#: moved: nothing ran), each after the slot map is read again, the later ones after a pause
#: (``_ROUTE_PAUSE`` doubled each time, 0.75 s in all): right after a failover the node asked
#: for the map may not know the slot's new master yet (the cluster's views converge by gossip,
#: slower on a loaded machine), as redis-py's own client waits on ``TRYAGAIN``.
_ROUTE_ATTEMPTS = 6
_ROUTE_PAUSE = 0.05
#: Replies that say the command did not run on that node: another node serves the slot now.
_REDIRECTED = (AskError, TryAgainError)  # MovedError is an AskError


def _is_cluster(client: Any) -> bool:
    return hasattr(client, "get_node_from_key")


async def pipeline_async(client: Any, key: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """``commands`` in order on ONE connection of ``key``'s server, in one round trip; each
    reply in its place, an error reply as its exception.

    On a cluster client, on a connection of the master of ``key``'s slot, not through the
    cluster pipeline: that one may send a redirected command again on another connection,
    where a ``WAIT`` would count none of the script's write. A redirection (nothing ran) reads
    the slot map again and tries again; a lost connection reads it again for the next call
    and raises (what ran is unknown).
    """
    if not _is_cluster(client):
        pipe = client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(await pipe.execute(raise_on_error=False))
    from redis.asyncio.cluster import PipelineCommand

    rereads = _rereads(client)
    for attempt in range(_ROUTE_ATTEMPTS):
        if attempt > 1:
            await asyncio.sleep(_ROUTE_PAUSE * 2 ** (attempt - 2))
        await client.initialize()  # the first use reads the slot map; later, nothing
        node = client.get_node_from_key(key)
        queued = [PipelineCommand(i, *command) for i, command in enumerate(commands)]
        since = rereads.done
        try:
            await node.execute_pipeline(queued)
        except (RedisConnectionError, RedisTimeoutError, OSError):
            await rereads.reread(client, since)
            raise
        finally:
            if client.nodes_manager.nodes_cache.get(node.name) is not node:
                await _disconnect([node])  # dropped from the slot map while we used it
        replies = [command.result for command in queued]
        if isinstance(replies[0], _REDIRECTED):
            await rereads.reread(client, since)
            continue
        if isinstance(replies[0], RedisConnectionError | RedisTimeoutError):
            await rereads.reread(client, since)
        return replies
    raise RedisClusterException(f"the slot of {key!r} kept moving")


class _Rereads:
    """The slot map re-reads of one async cluster client in one loop: one at a time, none
    for a failure when one ended since the failed call took its node (in redis-py 5 a re-read
    builds new node objects and closes the old ones, cutting the calls in flight on them:
    each of those re-reading again would cut the next ones, and so on)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lock = asyncio.Lock()
        self.done = 0  # re-reads ended

    async def reread(self, client: Any, since: int) -> None:
        """Read the slot map again unless one ended since ``done`` was ``since`` (one under
        way is waited for), and close every node object the new map dropped: redis-py 5 only
        schedules their closing, and a node still in use then (a re-read's own
        ``CLUSTER SLOTS`` on a seed another re-read had dropped) was left connected for good."""
        async with self.lock:
            if self.done != since:
                return
            manager = client.nodes_manager
            before = _nodes(manager)
            try:
                with contextlib.suppress(*CLIENT_ERRORS):
                    await manager.initialize()
            finally:
                self.done += 1
            kept = {id(node) for node in _nodes(manager)}
            await _disconnect([node for node in before if id(node) not in kept])


#: Per async cluster client (or the per-loop proxy standing in for one).
_REREADS: weakref.WeakKeyDictionary[Any, _Rereads] = weakref.WeakKeyDictionary()


def _rereads(client: Any) -> _Rereads:
    loop = asyncio.get_running_loop()
    rereads = _REREADS.get(client)
    if rereads is None or rereads.loop is not loop:
        rereads = _REREADS[client] = _Rereads(loop)
    return rereads


def _nodes(manager: Any) -> list[Any]:
    return [*manager.nodes_cache.values(), *manager.startup_nodes.values()]


async def _disconnect(nodes: list[Any]) -> None:
    """Close every connection of ``nodes`` (which the slot map no longer holds)."""
    unique = list({id(node): node for node in nodes}.values())
    await asyncio.gather(*(node.disconnect() for node in unique), return_exceptions=True)


def pipeline_sync(client: Any, key: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """:func:`pipeline_async` on redis-py's sync clients (a cluster's: on the connection pool
    of the master of ``key``'s slot)."""
    cluster = _is_cluster(client)
    for attempt in range(_ROUTE_ATTEMPTS):
        if attempt > 1:
            time.sleep(_ROUTE_PAUSE * 2 ** (attempt - 2))
        target = client
        if cluster:
            target = client.get_redis_connection(client.get_node_from_key(key))
        pipe = target.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        try:
            replies = list(pipe.execute(raise_on_error=False))
        except (RedisConnectionError, RedisTimeoutError, OSError):
            if cluster:
                _refresh_sync(client)
            raise
        if cluster and isinstance(replies[0], _REDIRECTED):
            _refresh_sync(client)
            continue
        return replies
    raise RedisClusterException(f"the slot of {key!r} kept moving")


def _refresh_sync(client: Any) -> None:
    with contextlib.suppress(*CLIENT_ERRORS):
        client.nodes_manager.initialize()


def check_client(client: Any) -> None:
    """Refuse a user's client that decodes replies (stored responses are bytes).

    Raises:
        ConfigurationError: it does.
    """
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    if kwargs.get("decode_responses"):
        raise ConfigurationError(
            "the Redis client must be created with decode_responses=False "
            "(stored responses are bytes)"
        )


def sync_client(parsed: RedisURL) -> Any:
    """The store's own redis-py client for a URL, retries off: a command whose connection
    failed mid-flight is never resent (a resent ``reserve`` could find its own reservation)."""
    return redis_py.Redis.from_url(
        parsed.client_url,
        socket_timeout=parsed.timeout,
        socket_connect_timeout=parsed.connect_timeout,
        retry=Retry(NoBackoff(), 0),
    )


def _cluster_kwargs(parsed: ClusterURL) -> dict[str, Any]:
    o = parsed.options
    kwargs: dict[str, Any] = {
        "username": o.username,
        "password": o.password,
        "socket_timeout": o.timeout,
        "socket_connect_timeout": o.connect_timeout,
        "decode_responses": False,
    }
    if o.tls:
        kwargs["ssl"] = True
        if o.ssl_ca_certs:
            kwargs["ssl_ca_certs"] = o.ssl_ca_certs
    return kwargs


def async_cluster(parsed: ClusterURL) -> Any:
    """A ``redis.asyncio.RedisCluster`` for the URL (it connects on first use).

    Without CLIENT SETINFO on connect: with it, redis-py 8.1's async cluster client failed
    commands under 50 concurrent first uses ("'NoneType' object has no attribute 'writelines'",
    seen in the conformance suite); without it, never. ``driver_info=None`` turns it off where
    the client takes ``driver_info`` (it deprecates ``lib_name`` / ``lib_version``); older
    versions take those.
    """
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    if "driver_info" in inspect.signature(RedisCluster.__init__).parameters:
        extra: dict[str, Any] = {"driver_info": None}
    else:
        extra = {"lib_name": None, "lib_version": None}
    nodes = [ClusterNode(host, port) for host, port in parsed.nodes]
    return RedisCluster(startup_nodes=nodes, **extra, **_cluster_kwargs(parsed))


class _ClusterProxy:
    """A cluster client built when first needed (by :meth:`_get`), standing in for it."""

    #: Read by the store's client check; answered here so the check does not connect.
    connection_pool = None

    def __init__(self, parsed: ClusterURL) -> None:
        self._parsed = parsed
        self._client: Any = None
        reset_after_fork(self)

    def _after_fork(self) -> None:
        raise NotImplementedError

    def _get(self) -> Any:
        raise NotImplementedError

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)


class LoopCluster(_ClusterProxy):
    """One ``redis.asyncio.RedisCluster`` per event loop (a client is bound to the loop it first
    ran in): built on first use in a loop, closed when that loop ends
    (:mod:`retrysafe.stores._loops`), dropped in a forked child.

    Args:
        parsed: the cluster's URL.
    """

    def __init__(self, parsed: ClusterURL) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._guard: Any = None
        self._starting: asyncio.Task[None] | None = None  # registers the loop-end close
        super().__init__(parsed)

    def _after_fork(self) -> None:
        """In a forked child: the parent's client is never used (its sockets are shared)."""
        INHERITED.append((self._client, self._guard))
        self._client = self._loop = self._guard = None

    def _get(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            client = async_cluster(self._parsed)
            self._client, self._loop, self._guard = client, loop, None
            self._starting = loop.create_task(self._close_at_end(client))
        return self._client

    async def _close_at_end(self, client: Any) -> None:
        if self._client is client:  # not closed meanwhile
            self._guard = await close_with_loop(functools.partial(self._end, client))

    async def _end(self, client: Any) -> None:
        if self._client is client:
            self._client = self._loop = self._guard = None
        await client.aclose()

    async def aclose(self) -> None:
        """Close this loop's client now (a later call builds a new one)."""
        if self._loop is not asyncio.get_running_loop():
            return
        client, guard = self._client, self._guard
        self._client = self._loop = self._guard = None
        if guard is not None:
            await guard.aclose()  # runs _end
        elif client is not None:
            await client.aclose()


class LazyCluster(_ClusterProxy):
    """A ``redis.cluster.RedisCluster`` built on first use.

    The sync cluster client connects and reads the slot map in its constructor; built lazily,
    an unreachable cluster or a wrong password fails the first operation with a
    :class:`~retrysafe.StoreError` (answered ``503``) instead of the application's start-up, and
    the next operation tries again.

    Args:
        parsed: the cluster's URL.
    """

    def __init__(self, parsed: ClusterURL) -> None:
        self._lock = threading.Lock()
        super().__init__(parsed)

    def _after_fork(self) -> None:
        """In a forked child: a new lock (the client's pools check the pid themselves)."""
        self._lock = threading.Lock()

    def _get(self) -> Any:
        from redis.cluster import ClusterNode, RedisCluster

        with self._lock:
            if self._client is None:
                nodes = [ClusterNode(h, p) for h, p in self._parsed.nodes]  # type: ignore[no-untyped-call]
                self._client = RedisCluster(startup_nodes=nodes, **_cluster_kwargs(self._parsed))
            return self._client

    def close(self) -> None:
        """Close the client, if it was built."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
