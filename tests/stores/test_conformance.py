"""The store contract, proven the same way on every backend."""

from __future__ import annotations

import asyncio
import threading

import pytest

from .conftest import Backend

FP = "fingerprint-a"
OTHER_FP = "fingerprint-b"
LEASE = 0.6
TTL = 30.0


def rid(backend: Backend, name: str) -> str:
    return f"{backend.id}-{name}-{id(backend):x}"


async def test_first_reserve_wins_and_second_sees_in_progress(backend: Backend) -> None:
    first = await backend.store.reserve(rid(backend, "k"), FP, lease=LEASE, ttl=TTL)
    second = await backend.store.reserve(rid(backend, "k"), FP, lease=LEASE, ttl=TTL)
    assert first.acquired and first.token
    assert not second.acquired
    assert second.record is not None
    assert second.record.state == "in_progress"
    assert second.record.fingerprint == FP
    assert 0 < second.record.lease_remaining <= LEASE


async def test_completed_record_is_returned_with_its_response(backend: Backend) -> None:
    key = rid(backend, "done")
    won = await backend.store.reserve(key, FP, lease=LEASE, ttl=TTL)
    assert won.token
    body = b"\x00stored\xffresponse" * 100
    assert await backend.store.complete(key, won.token, body, ttl=TTL)
    again = await backend.store.reserve(key, FP, lease=LEASE, ttl=TTL)
    assert not again.acquired and again.record is not None
    assert again.record.state == "completed"
    assert again.record.response == body
    got = await backend.store.get(key)
    assert got is not None and got.response == body and got.state == "completed"


async def test_other_fingerprint_sees_the_original_fingerprint(backend: Backend) -> None:
    key = rid(backend, "mismatch")
    won = await backend.store.reserve(key, FP, lease=LEASE, ttl=TTL)
    assert won.token
    other = await backend.store.reserve(key, OTHER_FP, lease=LEASE, ttl=TTL)
    assert other.record is not None and other.record.fingerprint == FP
    assert await backend.store.complete(key, won.token, b"r", ttl=TTL)
    other = await backend.store.reserve(key, OTHER_FP, lease=LEASE, ttl=TTL)
    assert other.record is not None and other.record.fingerprint == FP


async def test_release_frees_the_key(backend: Backend) -> None:
    key = rid(backend, "release")
    won = await backend.store.reserve(key, FP, lease=LEASE, ttl=TTL)
    assert won.token
    assert await backend.store.release(key, won.token)
    assert await backend.store.get(key) is None
    again = await backend.store.reserve(key, FP, lease=LEASE, ttl=TTL)
    assert again.acquired and again.token != won.token


async def test_lapsed_lease_is_taken_over_and_the_stale_token_is_fenced(backend: Backend) -> None:
    key = rid(backend, "takeover")
    crashed = await backend.store.reserve(key, FP, lease=LEASE, ttl=TTL)
    assert crashed.token
    await backend.advance(LEASE + 0.3)
    taker = await backend.store.reserve(key, FP, lease=5.0, ttl=TTL)
    assert taker.acquired and taker.token != crashed.token
    assert taker.token
    # The process that lost its lease can neither renew, overwrite nor delete the new record.
    assert not await backend.store.renew(key, crashed.token, lease=5.0)
    assert not await backend.store.complete(key, crashed.token, b"stale", ttl=TTL)
    assert not await backend.store.release(key, crashed.token)
    record = await backend.store.get(key)
    assert record is not None and record.state == "in_progress"
    assert await backend.store.complete(key, taker.token, b"fresh", ttl=TTL)
    record = await backend.store.get(key)
    assert record is not None and record.response == b"fresh"


async def test_renewal_keeps_a_slow_request_from_being_taken_over(backend: Backend) -> None:
    key = rid(backend, "renew")
    won = await backend.store.reserve(key, FP, lease=LEASE, ttl=TTL)
    assert won.token
    for _ in range(3):
        await backend.advance(LEASE / 2)
        assert await backend.store.renew(key, won.token, lease=LEASE)
    other = await backend.store.reserve(key, FP, lease=LEASE, ttl=TTL)
    assert not other.acquired


async def test_completed_record_expires_after_its_ttl(backend: Backend) -> None:
    key = rid(backend, "ttl")
    won = await backend.store.reserve(key, FP, lease=LEASE, ttl=TTL)
    assert won.token
    assert await backend.store.complete(key, won.token, b"r", ttl=0.5)
    await backend.advance(0.8)
    assert await backend.store.get(key) is None
    again = await backend.store.reserve(key, OTHER_FP, lease=LEASE, ttl=TTL)
    assert again.acquired


async def test_complete_is_once_only(backend: Backend) -> None:
    key = rid(backend, "once")
    won = await backend.store.reserve(key, FP, lease=LEASE, ttl=TTL)
    assert won.token
    assert await backend.store.complete(key, won.token, b"first", ttl=TTL)
    assert not await backend.store.complete(key, won.token, b"second", ttl=TTL)
    assert not await backend.store.release(key, won.token)
    record = await backend.store.get(key)
    assert record is not None and record.response == b"first"


async def test_unknown_record_is_none_and_fenced_ops_fail(backend: Backend) -> None:
    key = rid(backend, "never")
    assert await backend.store.get(key) is None
    assert not await backend.store.renew(key, "no-such-token", lease=LEASE)
    assert not await backend.store.complete(key, "no-such-token", b"x", ttl=TTL)
    assert not await backend.store.release(key, "no-such-token")


async def test_purge_deletes_only_expired_records(backend: Backend) -> None:
    short = [rid(backend, f"purge-{i}") for i in range(3)]
    keep = rid(backend, "purge-keep")
    for key in [*short, keep]:
        won = await backend.store.reserve(key, FP, lease=LEASE, ttl=TTL)
        assert won.token
        assert await backend.store.complete(key, won.token, b"r", ttl=0.5 if key != keep else TTL)
    await backend.advance(0.8)
    purged = await backend.store.purge_expired()
    if backend.purge_counts:
        assert purged >= 3
    for key in short:
        assert await backend.store.get(key) is None
    assert await backend.store.get(keep) is not None


async def test_one_winner_among_50_concurrent_tasks(backend: Backend) -> None:
    key = rid(backend, "race-tasks")
    results = await asyncio.gather(
        *(backend.store.reserve(key, FP, lease=5.0, ttl=TTL) for _ in range(50))
    )
    assert sum(r.acquired for r in results) == 1
    assert all(
        r.record is not None and r.record.fingerprint == FP for r in results if not r.acquired
    )


def test_one_winner_among_50_concurrent_threads(backend: Backend) -> None:
    key = rid(backend, "race-threads")
    barrier = threading.Barrier(50)
    wins: list[bool] = []
    errors: list[BaseException] = []

    def contend() -> None:
        try:
            barrier.wait()
            wins.append(backend.sync_store.reserve(key, FP, lease=5.0, ttl=TTL).acquired)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=contend) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(wins) == 50 and sum(wins) == 1


async def test_sync_twin_sees_the_same_records(backend: Backend) -> None:
    key = rid(backend, "twin")
    # A long lease: the async face's first call connects (on a cluster, discovers the slots)
    # after the sync face reserved, and on a busy machine that took longer than LEASE.
    won = backend.sync_store.reserve(key, FP, lease=TTL, ttl=TTL)
    assert won.token
    seen = await backend.store.reserve(key, FP, lease=LEASE, ttl=TTL)
    assert not seen.acquired
    assert backend.sync_store.complete(key, won.token, b"sync", ttl=TTL)
    record = await backend.store.get(key)
    assert record is not None and record.response == b"sync"


async def test_committed_record_is_never_taken_over(backend: Backend) -> None:
    key = rid(backend, "committed")
    won = await backend.store.reserve(key, FP, lease=LEASE, ttl=TTL)
    assert won.token
    assert not await backend.store.mark_committed(key, "stale-token", lease=LEASE)
    assert await backend.store.mark_committed(key, won.token, lease=LEASE)
    during = await backend.store.reserve(key, FP, lease=LEASE, ttl=TTL)
    assert during.record is not None and during.record.committed
    assert during.record.lease_remaining > 0
    await backend.advance(LEASE + 0.3)
    after = await backend.store.reserve(key, FP, lease=LEASE, ttl=TTL)
    # An uncommitted record would be taken over now; a committed one is "outcome unknown".
    assert not after.acquired
    assert after.record is not None and after.record.state == "in_progress"
    assert after.record.committed and after.record.lease_remaining == 0
    # Its owner, merely slow, can still store its answer.
    assert await backend.store.complete(key, won.token, b"late but known", ttl=TTL)
    record = await backend.store.get(key)
    assert record is not None and record.response == b"late but known"


async def test_ending_a_committed_lease_makes_the_outcome_unknown_at_once(
    backend: Backend,
) -> None:
    key = rid(backend, "unknown-now")
    won = await backend.store.reserve(key, FP, lease=30.0, ttl=TTL)
    assert won.token
    assert await backend.store.mark_committed(key, won.token, lease=30.0)
    assert await backend.store.renew(key, won.token, lease=0.0)
    await backend.advance(0.05)  # Redis keeps leases in whole milliseconds (at least 1)
    seen = await backend.store.reserve(key, FP, lease=LEASE, ttl=TTL)
    assert seen.record is not None and seen.record.committed
    assert seen.record.lease_remaining == 0


async def test_delete_frees_a_key_in_any_state(backend: Backend) -> None:
    key = rid(backend, "delete")
    won = await backend.store.reserve(key, FP, lease=LEASE, ttl=TTL)
    assert won.token
    assert await backend.store.mark_committed(key, won.token, lease=LEASE)
    assert await backend.store.delete(key)
    assert await backend.store.get(key) is None
    assert not await backend.store.delete(key)
    again = await backend.store.reserve(key, OTHER_FP, lease=LEASE, ttl=TTL)
    assert again.acquired
    # The old owner is fenced out of the new record.
    assert not await backend.store.complete(key, won.token, b"stale", ttl=TTL)


async def test_a_reservation_written_committed_is_what_reserve_and_mark_leave(
    backend: Backend,
) -> None:
    """``reserve_committed`` (stores that have it; the proxy's reservation with an upstream
    connection in hand): a won key is committed at once; others meet it as committed; its token
    completes or releases it; a key already held is not won."""
    reserve_committed = getattr(backend.store, "reserve_committed", None)
    if reserve_committed is None:
        pytest.skip("optional: the proxy reserves and marks in two calls on this store")
    key = rid(backend, "born-committed")
    won, committed = await reserve_committed(key, FP, lease=LEASE, ttl=TTL)
    assert committed and won.token
    seen, seen_committed = await reserve_committed(key, FP, lease=LEASE, ttl=TTL)
    assert not seen_committed and not seen.acquired
    assert seen.record is not None and seen.record.committed and seen.record.lease_remaining > 0
    await backend.advance(LEASE + 0.3)
    after = await backend.store.reserve(key, FP, lease=LEASE, ttl=TTL)
    assert not after.acquired  # committed: never taken over
    assert await backend.store.complete(key, won.token, b"answer", ttl=TTL)
    other = rid(backend, "born-committed-released")
    freed, _ = await reserve_committed(other, FP, lease=LEASE, ttl=TTL)
    assert freed.token and await backend.store.release(other, freed.token)
    assert await backend.store.get(other) is None
