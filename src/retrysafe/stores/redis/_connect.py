"""How each face of the Redis stores connects: the one place where they differ by more than
``await`` (so hand-written, one function per face and kind of store).

The async store talks through its own lean connection (a URL) or a user's asyncio client; the
sync store through redis-py's client. The heartbeat thread needs a synchronous client: the sync
store shares its own (redis-py's clients are thread-safe), the async store builds one from its
URL, and a user's asyncio client leaves it none (liveness off: the lease decides).
"""

from __future__ import annotations

from typing import Any

from ._client import ClientDriver as AsyncClientDriver
from ._client_sync import ClientDriver
from ._commands import ClusterURL, RedisURL
from ._heartbeat import ThreadClient
from ._lean import LeanDriver
from ._redispy import LazyCluster, LoopCluster, sync_client

__all__ = ["connect_async", "connect_cluster_async", "connect_cluster_sync", "connect_sync"]


def connect_async(
    parsed: RedisURL | None, client: Any
) -> tuple[LeanDriver | AsyncClientDriver, ThreadClient | None]:
    """The async store's driver and the heartbeat thread's client (``None``: no heartbeat)."""
    if client is not None:
        return AsyncClientDriver(client, owned=False), None
    assert parsed is not None
    return LeanDriver(parsed), ThreadClient(lambda: sync_client(parsed), close=True)


def connect_sync(parsed: RedisURL | None, client: Any) -> tuple[ClientDriver, ThreadClient]:
    """The sync store's driver and the heartbeat thread's client (the same one)."""
    owned = client is None
    if client is None:
        assert parsed is not None
        client = sync_client(parsed)
    return ClientDriver(client, owned=owned), ThreadClient(lambda: client, close=False)


def connect_cluster_async(parsed: ClusterURL) -> tuple[AsyncClientDriver, ThreadClient]:
    """The async cluster store's driver (an asyncio cluster client per event loop) and a sync
    cluster client of the heartbeat thread's own."""
    thread = ThreadClient(lambda: LazyCluster(parsed), close=True)
    return AsyncClientDriver(LoopCluster(parsed), owned=True), thread


def connect_cluster_sync(parsed: ClusterURL) -> tuple[ClientDriver, ThreadClient]:
    """The sync cluster store's driver (a cluster client built on first use), shared with the
    heartbeat thread."""
    client = LazyCluster(parsed)
    return ClientDriver(client, owned=True), ThreadClient(lambda: client, close=False)
