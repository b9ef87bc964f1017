"""``retrysafe stats`` and ``retrysafe purge --dry-run`` on every persistent store (each counts
its own records: its ``stats()`` method), and the same counts from the async faces."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from retrysafe.cli import main
from retrysafe.ops.stats import store_stats
from retrysafe.stores import MemoryStore, async_store_from_url, store_from_url

from ..stores import backend_mysql
from ..stores.backend_postgres import fresh_table_url
from ..stores.backend_redis import delete_prefixed, unique_prefix, with_prefix


def _delete_cluster_prefix(seeds: str, prefix: str) -> None:
    from redis.cluster import ClusterNode, RedisCluster

    nodes = [ClusterNode(h, int(p)) for h, p in (s.rsplit(":", 1) for s in seeds.split(","))]
    client = RedisCluster(startup_nodes=nodes)
    try:
        for name in list(client.scan_iter(match=f"{prefix}*")):
            client.delete(name)
    finally:
        client.close()


@pytest.fixture(params=["sqlite", "postgres", "mysql", "redis", "redis-cluster"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "redis-cluster":
        seeds = request.getfixturevalue("redis_cluster").seeds
        prefix = unique_prefix("stats")
        yield f"redis+cluster://{seeds}?prefix={prefix}"
        _delete_cluster_prefix(seeds, prefix)
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/s.db"
    elif request.param == "postgres":
        request.getfixturevalue("postgres_url")
        url = fresh_table_url(request)
        store = store_from_url(url)
        store.ensure_schema()  # type: ignore[attr-defined]
        store.close()
        yield url
    elif request.param == "mysql":
        url = backend_mysql.fresh_table_url(request)
        store = store_from_url(url)
        store.ensure_schema()  # type: ignore[attr-defined]
        store.close()
        yield url
    else:
        base = request.getfixturevalue("redis_url")
        prefix = unique_prefix("stats")
        yield with_prefix(base, prefix)
        delete_prefixed(base, prefix)


def _populate(url: str) -> None:
    """Two completed, one running (started ~now), one committed-and-running, one outcome
    unknown, and (SQL) one lapsed and one expired record."""
    store = store_from_url(url)
    try:
        for name in ("done-1", "done-2"):
            won = store.reserve(name, "fp", lease=30, ttl=3600)
            assert won.token and store.complete(name, won.token, b"x", ttl=3600)
        assert store.reserve("running", "fp", lease=30, ttl=3600).token
        won = store.reserve("committed", "fp", lease=30, ttl=3600)
        assert won.token and store.mark_committed("committed", won.token, lease=30)
        won = store.reserve("unknown", "fp", lease=30, ttl=3600)
        assert won.token and store.mark_committed("unknown", won.token, lease=0.001)
        if not url.startswith("redis"):
            assert store.reserve("lapsed", "fp", lease=0.001, ttl=3600).token
            won = store.reserve("expired", "fp", lease=0.001, ttl=0.002)
            assert won.token and store.complete("expired", won.token, b"x", ttl=0.002)
    finally:
        store.close()
    time.sleep(0.05)  # the short leases and the short retention run out


def test_stats_counts_each_state(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    _populate(store_url)
    assert main(["stats", "--store", store_url, "--json", "--ttl", "3600"]) == 0
    data = json.loads(capsys.readouterr().out)
    sql = not store_url.startswith("redis")
    assert data["completed"] == 2
    assert data["in_progress"] == 1
    assert data["committed"] == 1
    assert data["outcome_unknown"] == 1
    assert data["lapsed"] == (1 if sql else 0)
    assert data["expired"] == (1 if sql else 0)
    # The oldest running record started a moment ago (derived from its retention).
    assert 0 <= data["oldest_in_progress_age"] < 60
    assert main(["stats", "--store", store_url, "--fail-on-unknown"]) == 1
    text = capsys.readouterr().out
    assert "outcome unknown: 1" in text
    assert "in progress: 2 (1 with effects committed)" in text


def test_purge_dry_run_counts_without_deleting(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _populate(store_url)
    sql = not store_url.startswith("redis")
    assert main(["purge", "--store", store_url, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"would purge {1 if sql else 0} expired records" in out
    assert main(["purge", "--store", store_url, "--dry-run"]) == 0
    assert f"would purge {1 if sql else 0}" in capsys.readouterr().out  # nothing was deleted
    assert main(["purge", "--store", store_url]) == 0
    assert main(["purge", "--store", store_url, "--dry-run"]) == 0
    assert "would purge 0 expired" in capsys.readouterr().out


def test_empty_store_and_unreachable_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["stats", "--store", f"sqlite:///{tmp_path}/empty.db", "--fail-on-unknown"]) == 0
    out = capsys.readouterr().out
    assert "completed: 0" in out and "oldest in progress: none" in out
    assert main(["stats", "--store", "redis://127.0.0.1:1/0?connect_timeout=0.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("retrysafe: cannot use the store: ")
    assert main(["stats", "--store", "postgresql://postgres@127.0.0.1:1/x?connect_timeout=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("retrysafe: ")


# SQLite's async face runs the sync store inline: the sync store is the one that counts.
@pytest.mark.parametrize(
    "store_url", ["postgres", "mysql", "redis", "redis-cluster"], indirect=True
)
async def test_the_async_faces_count_the_same(store_url: str) -> None:
    _populate(store_url)
    sync = store_from_url(store_url)
    store = async_store_from_url(store_url)
    try:
        expected = store_stats(sync).as_dict()
        got = (await store.stats()).as_dict()  # type: ignore[attr-defined]
        for counts in (expected, got):
            counts.pop("oldest_in_progress_retention_left")  # read a moment apart
        assert got == expected
    finally:
        sync.close()
        await store.aclose()


def test_the_memory_store_counts_its_records() -> None:
    store = MemoryStore()
    won = store.reserve("done", "fp", lease=30, ttl=3600)
    assert won.token and store.complete("done", won.token, b"x", ttl=3600)
    assert store.reserve("running", "fp", lease=30, ttl=3600).token
    won = store.reserve("unknown", "fp", lease=30, ttl=3600)
    assert won.token and store.mark_committed("unknown", won.token, lease=0)
    assert store.reserve("lapsed", "fp", lease=0, ttl=3600).token
    stats = store_stats(store)
    assert (stats.completed, stats.in_progress, stats.outcome_unknown, stats.lapsed) == (1, 1, 1, 1)
    left = stats.oldest_in_progress_retention_left
    assert left is not None and 3590 < left <= 3600


def test_a_store_without_stats_is_told_so() -> None:
    class Bare:
        pass

    from retrysafe import ConfigurationError

    with pytest.raises(ConfigurationError, match="no statistics for Bare stores"):
        store_stats(Bare())  # type: ignore[arg-type]
