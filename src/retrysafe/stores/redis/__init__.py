"""Redis store: one service across many app instances (``redis://``, ``rediss://``).

Each record is a hash under ``<prefix><record id>`` (fingerprint, token, state, response, end
of retention, end of lease once committed; see ``lua/reserve.lua``). Every operation is ONE
round trip: a Lua script from ``lua/`` run with ``EVALSHA`` (the script is sent
with ``EVAL`` once when the server answers ``NOSCRIPT``, which also caches it again).
``reserve`` creates the record, takes over a lapsed lease or returns the record that holds the
key, atomically; ``renew``, ``mark_committed``, ``complete`` and ``release`` compare the token
first (fencing). Expiry is Redis's own: the key's TTL is the lease while the request runs, and
the retention once completed or once its effects are marked committed (such a record is never
taken over), so a crashed owner's reservation disappears when its lease lapses and
``purge_expired`` has nothing to do.

Cluster and Valkey: every script touches exactly one key, passed in ``KEYS``, so a cluster
client routes it; put a hash tag in the prefix (``?prefix={retrysafe}:``) to pin every record to
one slot if you want that. Pass a ``redis.asyncio.RedisCluster`` (or any redis-py client) as
``client=``; the store never closes a client it did not create.

Sync and async, one implementation: each operation is defined once, sans I/O, in
``_commands.py`` (which script, which arguments, how to read the reply). The async stores
(``_async.py``) carry a call over the wire through a driver: ``_lean.py`` (a lean pipelined
asyncio connection on hiredis, measured 6-8x less client CPU per command than redis-py's asyncio
client) for a URL, ``_client.py`` for a user's redis-py asyncio client or the cluster's. The
sync stores (``_sync.py``, redis-py) and their driver (``_client_sync.py``) are generated from
those. Hand-written: the lean connection, the heartbeat thread (``_heartbeat.py``) and how each
face connects (``_connect.py``).

Redis Cluster (``redis+cluster://``, ``rediss+cluster://``): the same stores with a cluster
client of their own (:class:`AsyncRedisClusterStore`, :class:`RedisClusterStore`; see
:mod:`retrysafe.stores.redis_cluster`).

Importing this package registers the schemes without importing redis-py or hiredis; the
classes load them on first use.

Acknowledged writes (``?replicas=N``): the reservation, the completion and the commit mark are
each followed by ``WAIT N timeout`` on the same connection (pipelined; the async store's writes
sent together share one); a write fewer replicas acknowledged in time is
:class:`StoreUnavailableError`, never answered as durable. A reserve whose reply never came keeps
its token (``LostReplies``): the same process's retry of the same request sends it again, and
``reserve.lua`` resumes its own reservation.

Errors: connection refused, lost or timed out become :class:`StoreUnavailableError`, anything
else :class:`StoreError`; no redis-py or hiredis exception leaves the store. A command whose
connection failed mid-flight is never resent (its effect is unknown; a resent ``reserve`` could
find its own reservation and answer 409), so the store's own redis-py client has retries off.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from .._registry import Backend, lazy_classes, register_backend
from ._commands import (
    REDIS_PY_OPTIONS,
    URL_OPTIONS,
    ClusterURL,
    RedisURL,
    parse_cluster_url,
    parse_redis_url,
)

if TYPE_CHECKING:
    from ._async import AsyncRedisClusterStore, AsyncRedisStore
    from ._sync import RedisClusterStore, RedisStore

__all__ = [
    "AsyncRedisClusterStore",
    "AsyncRedisStore",
    "ClusterURL",
    "RedisClusterStore",
    "RedisStore",
    "RedisURL",
    "parse_cluster_url",
    "parse_redis_url",
]

BACKEND = Backend(
    name="redis",
    schemes=("redis", "rediss"),
    store="retrysafe.stores.redis._sync:RedisStore",
    async_store="retrysafe.stores.redis._async:AsyncRedisStore",
    options=URL_OPTIONS,
    passed=REDIS_PY_OPTIONS,
    extra="redis",
)
CLUSTER_BACKEND = dataclasses.replace(
    BACKEND,
    name="redis-cluster",
    schemes=("redis+cluster", "rediss+cluster"),
    store="retrysafe.stores.redis._sync:RedisClusterStore",
    async_store="retrysafe.stores.redis._async:AsyncRedisClusterStore",
    passed=frozenset({"ssl_ca_certs"}),
)
register_backend(BACKEND)
register_backend(CLUSTER_BACKEND)

# The store classes import redis-py and hiredis: loaded on first use, not by the registration.
__getattr__ = lazy_classes(
    __name__,
    {
        "AsyncRedisStore": "_async",
        "AsyncRedisClusterStore": "_async",
        "RedisStore": "_sync",
        "RedisClusterStore": "_sync",
    },
)
