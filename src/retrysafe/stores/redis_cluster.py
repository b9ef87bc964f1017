"""Redis Cluster store (``redis+cluster://``, ``rediss+cluster://``), on redis-py's cluster clients.

The same scripts and the same operations as :mod:`retrysafe.stores.redis` (these classes are its
stores with a cluster client of their own; they live in that package, this module names them):
every script touches exactly one key, the record, so each call goes to the master of that key's
slot, and redis-py follows ``MOVED`` / ``ASK`` redirections and re-reads the slot map after a
failover. Owner liveness works as on one server (the heartbeat key lives in its own slot;
reading it is one more call, on conflicts only).

URL: ``redis+cluster://[user:password@]host:port[,host:port...][?option=value]``, any reachable
nodes as seeds (the rest are discovered). Options: ``prefix``, ``timeout``, ``connect_timeout``,
``heartbeat``, ``replicas``, ``replicas_timeout`` as for ``redis://``, and ``ssl_ca_certs`` (a CA
file for ``rediss+cluster://``).
A hash tag in the prefix (``prefix={orders}:``) pins every record to one slot, which the store
does not need: one record is one key.

Retries: unlike the single-server store, the cluster clients keep redis-py's retries: after a
connection error or timeout they re-read the slot map and resend, which is how a command finds
a slot's new master after a failover. So a command may reach Redis twice, and the scripts are
safe to repeat: a resent ``reserve`` recognises its own token and wins (without that, a lost
reply would strand the key until its lease lapsed), renewals and marks are idempotent, a
resent ``complete`` answers "done" (same token, same response), and a resent ``release``
answers "fenced out", which the middleware only reports. Redirections (``MOVED``,
``ASK``) are followed either way. A failure inside the cluster client that is not one of
redis-py's errors is answered as :class:`~retrysafe.StoreUnavailableError` too (``503``, never
a 500).

Failover: a planned ``CLUSTER FAILOVER`` waits for the replica to catch up and pauses writes to
the old master meanwhile (milliseconds when the replica is in sync); the tests run one per
master under load. Keep the lease (30 s by default) well above the cluster's failover time.

Durability: Redis replicates asynchronously. A planned failover (``CLUSTER FAILOVER``) loses
nothing; a master that crashes can lose its last acknowledged writes, and a lost reservation
lets a retry run again. ``?replicas=N`` makes each reservation, completion and commit mark wait
for N replicas of its slot's master (``WAIT``, pipelined after the script on a connection of
that master, not through redis-py's cluster pipeline, which may resend a redirected command on
another connection, where a ``WAIT`` would count nothing of it); one not acknowledged in time
is :class:`~retrysafe.StoreUnavailableError` (``503``). Run the masters with AOF where that
matters.
"""

from __future__ import annotations

from .redis._async import AsyncRedisClusterStore
from .redis._commands import ClusterURL, parse_cluster_url
from .redis._sync import RedisClusterStore

__all__ = [
    "AsyncRedisClusterStore",
    "ClusterURL",
    "RedisClusterStore",
    "parse_cluster_url",
]
