"""The wire contract (DESIGN section 2), row by row, on every shell and every store."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ..e2e.servers import free_port
from .conftest import ServiceFactory
from .harness import ASYNC_SHELLS, REPLAYED, Service, World, problem_type

ORDER = {"item": "book", "quantity": 2}
SAME_HEADERS = ("location", "content-type", "etag", "x-custom", "cache-control", "content-length")


# -- first request, replay ------------------------------------------------------------------


def test_first_request_runs_and_passes_through_unchanged(svc: Service, world: World) -> None:
    response = svc.post(key="k1", json=ORDER)
    assert response.status_code == 201
    assert response.json()["call"] == 1
    assert response.json()["len"] == len(response.request.content)
    assert response.headers["location"] == "/orders/1"
    assert response.headers["set-cookie"] == "session=1"
    assert REPLAYED not in response.headers
    assert world["/orders"] == 1


def test_retry_is_replayed_byte_for_byte_and_the_handler_does_not_run(
    svc: Service, world: World
) -> None:
    first = svc.post(key="k1", json=ORDER)
    replays = [svc.post(key="k1", json=ORDER) for _ in range(2)]
    assert world["/orders"] == 1
    for replay in replays:
        assert replay.status_code == 201
        assert replay.content == first.content
        for name in SAME_HEADERS:
            assert replay.headers[name] == first.headers[name], name
        assert replay.headers[REPLAYED] == "true"


def test_streamed_response_is_replayed_as_the_whole_body(svc: Service, world: World) -> None:
    first = svc.post(key="k1", json=ORDER, params={"chunks": "4"})
    replay = svc.post(key="k1", json=ORDER, params={"chunks": "4"})
    assert first.json()["call"] == 1
    assert replay.content == first.content
    assert replay.headers[REPLAYED] == "true"
    assert world["/orders"] == 1


def test_response_over_the_storable_size_replays_status_and_headers_without_body(
    make_service: ServiceFactory, world: World
) -> None:
    svc = make_service(max_stored_body_size=1000)
    first = svc.post(key="k1", params={"size": "5000"})
    replay = svc.post(key="k1", params={"size": "5000"})
    assert first.content == b"x" * 5000
    assert REPLAYED not in first.headers
    assert replay.status_code == 201
    assert replay.headers["location"] == "/orders/1"
    assert replay.headers["idempotency-body-omitted"] == "true"
    assert replay.headers["content-length"] == "0"
    assert replay.headers[REPLAYED] == "true"
    assert replay.content == b""
    assert world["/orders"] == 1


def test_quoted_and_bare_key_address_the_same_record(svc: Service, world: World) -> None:
    first = svc.post(json=ORDER, headers={"Idempotency-Key": '"k-7"'})
    second = svc.post(json=ORDER, headers={"Idempotency-Key": "k-7"})
    assert second.headers[REPLAYED] == "true"
    assert second.content == first.content
    assert world["/orders"] == 1


def test_different_keys_each_run(svc: Service) -> None:
    a, b = svc.post(key="a", json=ORDER), svc.post(key="b", json=ORDER)
    assert (a.json()["call"], b.json()["call"]) == (1, 2)


def test_same_key_on_another_method_or_path_is_another_record(svc: Service, world: World) -> None:
    svc.post(key="k1", json=ORDER)
    patched = svc.post(key="k1", json=ORDER, method="PATCH")
    other = svc.post("/payments", key="k1", json=ORDER)
    assert patched.status_code == 201 and REPLAYED not in patched.headers
    assert other.status_code == 201 and REPLAYED not in other.headers
    assert world["/orders"] == 2
    assert world["/payments"] == 1


# -- 409 while running; on_conflict=wait ----------------------------------------------------


def test_409_with_retry_after_while_the_first_request_runs(
    make_service: ServiceFactory, world: World
) -> None:
    svc = make_service(lease=20.0)
    first = svc.background(key="k1", json=ORDER, params={"hold": "1"})
    world.wait_entered()
    conflict = svc.post(key="k1", json=ORDER, params={"hold": "1"})
    world.open()
    done = first.result()
    replay = svc.post(key="k1", json=ORDER, params={"hold": "1"})
    assert conflict.status_code == 409
    assert problem_type(conflict) == "idempotency-request-in-progress"
    assert 1 <= int(conflict.headers["retry-after"]) <= 20
    assert done.status_code == 201
    assert replay.headers[REPLAYED] == "true"
    assert replay.content == done.content
    assert world["/orders"] == 1


def test_on_conflict_wait_replays_the_first_response_when_it_finishes(
    make_service: ServiceFactory, world: World
) -> None:
    svc = make_service(on_conflict="wait", conflict_wait=10.0)
    first = svc.background(key="k1", json=ORDER, params={"hold": "1"})
    world.wait_entered()
    waiting = svc.background(key="k1", json=ORDER, params={"hold": "1"})
    time.sleep(0.1)
    assert not waiting.done()
    world.open()
    done, replay = first.result(), waiting.result()
    assert done.status_code == replay.status_code == 201
    assert replay.headers[REPLAYED] == "true"
    assert replay.content == done.content
    assert replay.headers["location"] == "/orders/1"
    assert world["/orders"] == 1


def test_on_conflict_wait_gives_409_after_conflict_wait(
    make_service: ServiceFactory, world: World
) -> None:
    svc = make_service(on_conflict="wait", conflict_wait=0.2)
    first = svc.background(key="k1", json=ORDER, params={"hold": "1"})
    world.wait_entered()
    conflict = svc.post(key="k1", json=ORDER, params={"hold": "1"})
    world.open()
    assert first.result().status_code == 201
    assert conflict.status_code == 409
    assert "retry-after" in conflict.headers
    assert world["/orders"] == 1


def test_on_conflict_wait_runs_the_waiting_request_when_the_first_fails(
    make_service: ServiceFactory, world: World
) -> None:
    # The first request failed (its key released): the waiting one wins the key and runs.
    svc = make_service(on_conflict="wait", conflict_wait=10.0)
    params = {"hold": "1", "fail": "first"}
    first = svc.background(key="k1", json=ORDER, params=params)
    world.wait_entered()
    waiting = svc.background(key="k1", json=ORDER, params=params)
    time.sleep(0.1)
    assert not waiting.done()
    world.open()
    failed, ran = first.result(), waiting.result()
    assert failed.status_code == 500
    assert ran.status_code == 201 and ran.json()["call"] == 2
    assert REPLAYED not in ran.headers
    assert world["/orders"] == 2


# -- 422 --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"json": {"item": "book", "quantity": 3}},
        {"params": {"coupon": "x"}},
        {"content": b'{ "item": "book", "quantity": 2 }', "json": None},
    ],
    ids=["body", "query", "same-json-other-bytes"],
)
def test_same_key_with_a_different_request_is_422_and_nothing_runs(
    svc: Service, world: World, change: dict[str, Any]
) -> None:
    first = svc.post(key="k1", json=ORDER)
    reused = svc.post(key="k1", **({"json": ORDER} | change))
    replay = svc.post(key="k1", json=ORDER)
    assert reused.status_code == 422
    assert problem_type(reused) == "idempotency-key-reused"
    assert world["/orders"] == 1
    assert replay.content == first.content


def assert_two_records(svc: Service, one: str, other: str) -> None:
    """One key on the paths ``one`` and ``other``: two records, each replayed to its own path."""
    first = svc.post(one, key="k1", json=ORDER)
    second = svc.post(other, key="k1", json=ORDER)
    again = svc.post(one, key="k1", json=ORDER)
    assert first.status_code == second.status_code == 201
    assert REPLAYED not in second.headers
    assert again.headers[REPLAYED] == "true" and again.content == first.content


def test_paths_that_differ_in_bytes_that_are_not_utf8_are_two_records(svc: Service) -> None:
    # Both decode to U+FFFD; the app receives the bytes (PATH_INFO, raw_path, Django's path).
    assert_two_records(svc, "/orders/x%FF", "/orders/x%FE")


def test_an_encoded_slash_is_another_path_than_a_slash(svc: Service) -> None:
    assert_two_records(svc, "/orders/a%2Fb", "/orders/a/b")


def test_repeated_query_values_in_another_order_are_another_request(
    svc: Service, world: World
) -> None:
    # Flask's args.get reads the first of repeated values, Django's GET.get the last.
    first = svc.post(key="k1", json=ORDER, params=[("qty", "1"), ("qty", "5")])
    swapped = svc.post(key="k1", json=ORDER, params=[("qty", "5"), ("qty", "1")])
    assert first.status_code == 201
    assert swapped.status_code == 422
    assert world["/orders"] == 1


def test_query_names_in_another_order_are_the_same_request(svc: Service, world: World) -> None:
    first = svc.post(key="k1", json=ORDER, params=[("a", "1"), ("qty", "1"), ("qty", "5")])
    again = svc.post(key="k1", json=ORDER, params=[("qty", "1"), ("a", "1"), ("qty", "5")])
    assert again.headers[REPLAYED] == "true" and again.content == first.content
    assert world["/orders"] == 1


def test_different_request_is_422_even_while_the_first_runs(svc: Service, world: World) -> None:
    first = svc.background(key="k1", json=ORDER, params={"hold": "1"})
    world.wait_entered()
    reused = svc.post(key="k1", content=b"other", params={"hold": "1"})
    world.open()
    assert first.result().status_code == 201
    assert reused.status_code == 422
    assert world["/orders"] == 1


# -- 400 --------------------------------------------------------------------------------------


def test_missing_key_is_400_when_required(make_service: ServiceFactory, world: World) -> None:
    svc = make_service(required=True)
    missing = svc.post(json=ORDER)
    keyed = svc.post(key="k1", json=ORDER)
    assert missing.status_code == 400
    assert problem_type(missing) == "idempotency-key-missing"
    assert keyed.status_code == 201
    assert world["/orders"] == 1


MALFORMED = [
    pytest.param([("Idempotency-Key", "")], id="empty"),
    pytest.param([("Idempotency-Key", '""')], id="empty-quoted"),
    pytest.param([("Idempotency-Key", "k" * 256)], id="256-chars"),
    pytest.param([("Idempotency-Key", '"unterminated')], id="unterminated"),
    pytest.param([("Idempotency-Key", '"a" trailing')], id="trailing"),
    pytest.param([("Idempotency-Key", '"a\\x"')], id="bad-escape"),
    pytest.param([("Idempotency-Key", "a\x01b")], id="control"),
    pytest.param([("Idempotency-Key", b"caf\xc3\xa9")], id="non-ascii"),
    pytest.param([("Idempotency-Key", "a b")], id="bare-space"),
    pytest.param([("Idempotency-Key", "one"), ("Idempotency-Key", "two")], id="two-fields"),
    pytest.param([("Idempotency-Key", '"a"'), ("Idempotency-Key", '"a"')], id="two-equal-quoted"),
    pytest.param([("Idempotency-Key", "same"), ("Idempotency-Key", "same")], id="two-equal-bare"),
]


@pytest.mark.parametrize("headers", MALFORMED)
def test_malformed_key_is_400_and_nothing_runs(
    svc: Service, world: World, headers: list[tuple[str, str | bytes]]
) -> None:
    response = svc.post(json=ORDER, headers=headers)
    assert response.status_code == 400
    assert problem_type(response) == "idempotency-key-invalid"
    assert world["/orders"] == 0


def test_key_of_255_characters_is_accepted(svc: Service, world: World) -> None:
    first = svc.post(json=ORDER, headers={"Idempotency-Key": "k" * 255})
    replay = svc.post(json=ORDER, headers={"Idempotency-Key": "k" * 255})
    assert first.status_code == 201
    assert replay.headers[REPLAYED] == "true"
    assert world["/orders"] == 1


# -- 413 --------------------------------------------------------------------------------------


def test_body_over_the_limit_with_content_length_is_413_and_nothing_runs(
    make_service: ServiceFactory, world: World
) -> None:
    svc = make_service(max_body_size=100)
    too_big = svc.post(key="k1", content=b"x" * 101)
    exact = svc.post(key="k1", content=b"x" * 100)
    assert too_big.request.headers["content-length"] == "101"
    assert too_big.status_code == 413
    assert problem_type(too_big) == "idempotency-request-too-large"
    # Nothing was reserved: the same key then runs with a body within the limit (no 422).
    assert exact.status_code == 201
    assert exact.json()["len"] == 100
    assert world["/orders"] == 1


def test_chunked_body_over_the_limit_is_413_and_nothing_runs(
    make_service: ServiceFactory, world: World
) -> None:
    def chunks(total: int) -> Any:
        for _ in range(total // 10):
            yield b"y" * 10

    svc = make_service(max_body_size=100)
    too_big = svc.post(key="k1", content=chunks(110))
    exact = svc.post(key="k2", content=chunks(100))
    replay = svc.post(key="k2", content=chunks(100))
    assert "content-length" not in too_big.request.headers
    assert too_big.request.headers["transfer-encoding"] == "chunked"
    assert too_big.status_code == 413
    assert problem_type(too_big) == "idempotency-request-too-large"
    assert exact.status_code == 201
    assert exact.json()["len"] == 100
    assert replay.headers[REPLAYED] == "true"
    assert world["/orders"] == 1


def test_default_limit_admits_one_mebibyte_and_rejects_one_byte_more(
    svc: Service, world: World
) -> None:
    mib = 1024 * 1024
    at_limit = svc.post(key="k1", content=b"z" * mib)
    over = svc.post(key="k2", content=b"z" * (mib + 1))
    assert at_limit.status_code == 201 and at_limit.json()["len"] == mib
    assert over.status_code == 413
    assert world["/orders"] == 1


# -- store unreachable --------------------------------------------------------------------------


def _unreachable(kind: str, shell: str, tmp_path: Path) -> Any:
    """A real store that cannot be reached: a closed loopback port, or a database file whose
    folder is a regular file."""
    if kind == "sqlite":
        (tmp_path / "not-a-folder").write_text("")
        from retrysafe.stores import AsyncSQLiteStore, SQLiteStore

        path = tmp_path / "not-a-folder" / "store.db"
        return AsyncSQLiteStore(path) if shell in ASYNC_SHELLS else SQLiteStore(path)
    port = free_port()
    if kind == "postgres":
        from retrysafe.stores.postgres import AsyncPostgresStore, PostgresStore

        url = f"postgresql://postgres@127.0.0.1:{port}/test?connect_timeout=1&pool_timeout=1"
        return AsyncPostgresStore(url) if shell in ASYNC_SHELLS else PostgresStore(url)
    if kind == "mysql":
        from retrysafe.stores.mysql import AsyncMySQLStore, MySQLStore

        url = f"mysql://root@127.0.0.1:{port}/test?connect_timeout=1&pool_timeout=1"
        return AsyncMySQLStore(url) if shell in ASYNC_SHELLS else MySQLStore(url)
    from retrysafe.stores.redis import AsyncRedisStore, RedisStore

    url = f"redis://127.0.0.1:{port}/0?connect_timeout=0.5&timeout=0.5"
    return AsyncRedisStore(url) if shell in ASYNC_SHELLS else RedisStore(url)


DOWN = ["sqlite", "postgres", "mysql", "redis"]


@pytest.mark.parametrize("kind", DOWN)
def test_unreachable_store_is_503_with_retry_after_and_nothing_runs(
    shell: str, kind: str, tmp_path: Path
) -> None:
    world = World()
    svc = Service(shell, _unreachable(kind, shell, tmp_path), world, store_retry_after=7)
    try:
        response = svc.post(key="k1", json=ORDER)
        again = svc.post(key="k1", json=ORDER)
    finally:
        svc.close()
    for answer in (response, again):
        assert answer.status_code == 503
        assert problem_type(answer) == "idempotency-store-unavailable"
        assert answer.headers["retry-after"] == "7"
    assert world["/orders"] == 0


@pytest.mark.parametrize("kind", DOWN)
def test_unreachable_store_with_fail_open_runs_the_handler_with_its_body(
    shell: str, kind: str, tmp_path: Path
) -> None:
    world = World()
    events: list[str] = []
    store = _unreachable(kind, shell, tmp_path)

    def hook(event: str, details: object) -> None:
        events.append(event)

    svc = Service(shell, store, world, on_store_error="fail_open", on_event=hook)
    try:
        first = svc.post(key="k1", json=ORDER)
        second = svc.post(key="k1", json=ORDER)
    finally:
        svc.close()
    assert (first.status_code, second.status_code) == (201, 201)
    assert first.json()["len"] == len(first.request.content)
    assert (first.json()["call"], second.json()["call"]) == (1, 2)
    assert REPLAYED not in second.headers
    assert events.count("fail_open") == 2  # reported (logged and to the hook), never silent


# -- pass-through ---------------------------------------------------------------------------------


def test_no_key_on_an_optional_route_runs_unprotected_every_time(
    svc: Service, world: World
) -> None:
    first = svc.post(json=ORDER)
    second = svc.post(json=ORDER)
    assert (first.json()["call"], second.json()["call"]) == (1, 2)
    assert first.json()["len"] == len(first.request.content)
    assert REPLAYED not in second.headers


def test_unprotected_methods_pass_straight_through(
    make_service: ServiceFactory, world: World
) -> None:
    svc = make_service(required=True)
    g1 = svc.post(key="k1", method="GET")
    g2 = svc.post(key="k1", method="GET")
    p1 = svc.post(json=ORDER, method="PUT", headers={"Idempotency-Key": ""})
    p2 = svc.post(json=ORDER, method="PUT")
    assert (g1.json()["call"], g2.json()["call"]) == (1, 2)
    assert (p1.status_code, p2.status_code) == (201, 201)
    assert world["/orders"] == 4


def test_configured_methods_protect_put_and_leave_post_alone(
    make_service: ServiceFactory, world: World
) -> None:
    svc = make_service(methods=frozenset({"PUT"}))
    svc.post(key="k1", json=ORDER, method="PUT")
    replay = svc.post(key="k1", json=ORDER, method="PUT")
    p1 = svc.post(key="k1", json=ORDER)
    p2 = svc.post(key="k1", json=ORDER)
    assert replay.headers[REPLAYED] == "true"
    assert REPLAYED not in p2.headers
    assert (p1.json()["call"], p2.json()["call"]) == (2, 3)


def test_store_that_stops_answering_mid_request_still_delivers_the_response_and_stores_it_later(
    shell: str, tmp_path: Path, redis_url: str
) -> None:
    # A real outage: the test's own redis-server is paused (SIGSTOP) while the handler runs, so
    # storing the response times out; the client still gets its answer, retries meanwhile get
    # 503, and once the server answers again the background completion stores the response.
    import signal

    from retrysafe.stores.redis import AsyncRedisStore, RedisStore

    from ..stores.backend_redis import PrivateRedis

    server = PrivateRedis(tmp_path / "redis").start()
    assert server.proc is not None
    url = f"{server.url}?timeout=0.3&connect_timeout=0.3"
    world = World()
    store = AsyncRedisStore(url) if shell in ASYNC_SHELLS else RedisStore(url)
    events: list[str] = []
    svc = Service(shell, store, world, store_retry_after=2, on_event=lambda e, d: events.append(e))
    try:
        running = svc.background(key="k1", json=ORDER, params={"hold": "1"})
        world.wait_entered()
        server.proc.send_signal(signal.SIGSTOP)
        try:
            world.open()
            done = running.result()
            during = svc.post(key="k1", json=ORDER, params={"hold": "1"})
        finally:
            server.proc.send_signal(signal.SIGCONT)
        assert done.status_code == 201 and done.json()["call"] == 1
        assert during.status_code == 503
        assert problem_type(during) == "idempotency-store-unavailable"
        assert during.headers["retry-after"] == "2"
        deadline = time.monotonic() + 10.0
        retry = during
        while REPLAYED not in retry.headers and time.monotonic() < deadline:
            time.sleep(0.1)
            retry = svc.post(key="k1", json=ORDER, params={"hold": "1"})
            assert retry.status_code in (409, 503, 201), retry.text
        assert retry.headers[REPLAYED] == "true"
        assert retry.content == done.content
        assert world["/orders"] == 1
        assert "completion_deferred" in events
    finally:
        svc.close()
        server.stop()
