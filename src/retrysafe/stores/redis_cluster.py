"""Redis Cluster store (``redis+cluster://``, ``rediss+cluster://``), on redis-py's cluster clients.

The same scripts and the same operations as :mod:`retrysafe.stores.redis` (these classes are its
stores with a cluster client of their own): every script touches exactly one key, the record,
so each call goes to the master of that key's slot, and redis-py follows ``MOVED`` / ``ASK``
redirections and re-reads the slot map after a failover. Owner liveness works as on one server
(the heartbeat key lives in its own slot; reading it is one more call, on conflicts only).

URL: ``redis+cluster://[user:password@]host:port[,host:port...][?option=value]``, any reachable
nodes as seeds (the rest are discovered). Options: ``prefix``, ``timeout``, ``connect_timeout``,
``heartbeat`` as for ``redis://``, and ``ssl_ca_certs`` (a CA file for ``rediss+cluster://``).
A hash tag in the prefix (``prefix={orders}:``) pins every record to one slot, which the store
does not need: one record is one key.

Retries: unlike the single-server store, the cluster clients keep redis-py's retries: after a
connection error or timeout they re-read the slot map and resend, which is how a command finds
a slot's new master after a failover. So a command may reach Redis twice, and the scripts are
safe to repeat: a resent ``reserve`` recognises its own token and wins (without that, a lost
reply would strand the key until its lease lapsed), renewals and marks are idempotent, and a
resent ``complete`` or ``release`` answers "fenced out", which the middleware only reports
(``lease_lost``; the response that ran is still the one sent). Redirections (``MOVED``,
``ASK``) are followed either way. A failure inside the cluster client that is not one of
redis-py's errors is answered as :class:`~retrysafe.StoreUnavailableError` too (``503``, never
a 500).

Failover: a planned ``CLUSTER FAILOVER`` waits for the replica to catch up and pauses writes to
the old master meanwhile (milliseconds when the replica is in sync); the tests run one per
master under load. Keep the lease (30 s by default) well above the cluster's failover time.

Durability: Redis replicates asynchronously. A planned failover (``CLUSTER FAILOVER``) loses
nothing; a master that crashes can lose its last acknowledged writes, and a lost reservation
lets a retry run again. Run the masters with AOF where that matters.
"""

from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass
from typing import Any

from .._core.errors import ConfigurationError, StoreError, StoreUnavailableError
from .redis import AsyncRedisStore, RedisStore, RedisURL, _Heartbeat, parse_redis_url

__all__ = [
    "AsyncRedisClusterStore",
    "ClusterURL",
    "RedisClusterStore",
    "parse_cluster_url",
]

_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


@dataclass(frozen=True, slots=True)
class ClusterURL:
    """A parsed ``redis+cluster://`` URL.

    Attributes:
        nodes: the seed nodes as (host, port).
        options: credentials, TLS and the store's options, as for one server.
    """

    nodes: tuple[tuple[str, int], ...]
    options: RedisURL


def parse_cluster_url(url: str) -> ClusterURL:
    """Parse ``redis+cluster://[user:password@]host:port[,host:port...][?options]``.

    Raises:
        ConfigurationError: not a cluster URL, no node, or a bad port or option.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        raise ConfigurationError(f"not a redis+cluster:// or rediss+cluster:// URL: {scheme}://...")
    location, _, query = rest.partition("?")
    netloc = location.split("/", 1)[0]
    credentials, at, hosts = netloc.rpartition("@")
    nodes: list[tuple[str, int]] = []
    for node in filter(None, hosts.split(",")):
        host, colon, port = node.rpartition(":")
        if not colon:
            host, port = node, "6379"
        try:
            nodes.append((host.strip("[]") or "127.0.0.1", int(port)))
        except ValueError:
            raise ConfigurationError(f"redis+cluster URL: bad port in {node!r}") from None
    if not nodes:
        raise ConfigurationError("redis+cluster URL names no node (host:port,host:port...)")
    first = f"{nodes[0][0]}:{nodes[0][1]}"
    single = f"{_SCHEMES[scheme.lower()]}://{credentials}{at}{first}/0"
    if query:
        single += "?" + query
    return ClusterURL(tuple(nodes), parse_redis_url(single))


def _client_kwargs(parsed: ClusterURL) -> dict[str, Any]:
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


def _async_extra(cls: Any) -> dict[str, Any]:
    """No CLIENT SETINFO on connect. With it, redis-py 8.1's async cluster client failed
    commands under 50 concurrent first uses ("'NoneType' object has no attribute 'writelines'",
    seen in the conformance suite); without it, never. ``driver_info=None`` turns it off where the
    client takes ``driver_info`` (it deprecates ``lib_name`` / ``lib_version``); older
    versions take those."""
    if "driver_info" in inspect.signature(cls.__init__).parameters:
        return {"driver_info": None}
    return {"lib_name": None, "lib_version": None}


class _LazyCluster:
    """A ``redis.cluster.RedisCluster`` built on first use.

    The sync cluster client connects and reads the slot map in its constructor; built lazily,
    an unreachable cluster or a wrong password fails the first operation with a
    :class:`~retrysafe.StoreError` (answered ``503``) instead of the application's start-up, and
    the next operation tries again.
    """

    #: Read by the store's client check; answered here so the check does not connect.
    connection_pool = None

    def __init__(self, parsed: ClusterURL) -> None:
        self._parsed = parsed
        self._client: Any = None
        self._lock = threading.Lock()

    def _get(self) -> Any:
        from redis.cluster import ClusterNode, RedisCluster

        with self._lock:
            if self._client is None:
                nodes = [ClusterNode(h, p) for h, p in self._parsed.nodes]  # type: ignore[no-untyped-call]
                self._client = RedisCluster(startup_nodes=nodes, **_client_kwargs(self._parsed))
            return self._client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


def _sync_cluster(parsed: ClusterURL) -> Any:
    return _LazyCluster(parsed)


class AsyncRedisClusterStore(AsyncRedisStore):
    """Keeps records in a Redis Cluster; asynchronous (ASGI), on ``redis.asyncio.RedisCluster``.

    Args:
        url: ``redis+cluster://host:port,host:port?prefix=...`` (or ``rediss+cluster://``).

    Raises:
        ConfigurationError: a bad URL.
    """

    def __init__(self, url: str) -> None:
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        parsed = parse_cluster_url(url)
        nodes = [ClusterNode(host, port) for host, port in parsed.nodes]
        client = RedisCluster(
            startup_nodes=nodes,
            **_async_extra(RedisCluster),
            **_client_kwargs(parsed),
        )
        super().__init__(client=client, prefix=parsed.options.prefix)
        self._cluster = client
        if parsed.options.heartbeat:
            self._heartbeat = _Heartbeat(
                lambda: _sync_cluster(parsed), self._commands.owner_key, parsed.options.heartbeat
            )

    @classmethod
    def from_url(cls, url: str) -> AsyncRedisClusterStore:
        """Build from ``redis+cluster://host:port,host:port?prefix=...``."""
        return cls(url)

    async def _run_client(self, call: Any) -> Any:
        try:
            return await super()._run_client(call)
        except StoreError:
            raise
        except Exception as exc:
            # Seen with redis-py 8.1's async cluster client under timeouts during a failover:
            # "'NoneType' object has no attribute 'writelines'" from a connection it had reset.
            raise StoreUnavailableError(
                f"Redis {call.script.name} failed in the cluster client: "
                f"{type(exc).__name__}: {exc}",
                store="redis",
            ) from exc

    async def aclose(self) -> None:
        """Stop the heartbeat and close the cluster client."""
        await super().aclose()
        await self._cluster.aclose()


class RedisClusterStore(RedisStore):
    """Keeps records in a Redis Cluster; synchronous (WSGI, Django, scripts), on
    ``redis.cluster.RedisCluster``.

    Args:
        url: ``redis+cluster://host:port,host:port?prefix=...`` (or ``rediss+cluster://``).

    Raises:
        ConfigurationError: a bad URL.
    """

    def __init__(self, url: str) -> None:
        parsed = parse_cluster_url(url)
        super().__init__(client=_sync_cluster(parsed), prefix=parsed.options.prefix)
        self._owned = True
        if not parsed.options.heartbeat:
            self._heartbeat = None
        elif self._heartbeat is not None:
            self._heartbeat.ttl = parsed.options.heartbeat

    @classmethod
    def from_url(cls, url: str) -> RedisClusterStore:
        """Build from ``redis+cluster://host:port,host:port?prefix=...``."""
        return cls(url)
