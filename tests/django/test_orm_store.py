"""The Django ORM store in transactional mode, on real SQLite and PostgreSQL: the view's ORM
writes and the stored response commit together, or neither does (rollback on exception and on
released statuses), with ``ATOMIC_REQUESTS`` on and off, sync and async stacks."""

from __future__ import annotations

import io
import sqlite3
import threading
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections

from retrysafe._core.keys import record_id
from retrysafe.contrib.django.store import DjangoStore
from retrysafe.demo.django_app.models import Order

from . import views
from .conftest import Api

ALIASES = [
    pytest.param("default", marks=pytest.mark.django_db(transaction=True)),
    pytest.param("pg", marks=pytest.mark.django_db(transaction=True, databases=["pg"])),
]


@pytest.fixture(params=ALIASES)
def alias(request: pytest.FixtureRequest) -> str:
    if request.param == "pg":
        request.getfixturevalue("postgres_url")  # skip (or fail under CI) without PostgreSQL
    return str(request.param)


@pytest.fixture(params=[False, True], ids=["plain", "atomic-requests"])
def atomic_requests(request: pytest.FixtureRequest, alias: str, monkeypatch: Any) -> bool:
    # Every thread's connection wrapper reads this one settings dict.
    monkeypatch.setitem(connections.settings[alias], "ATOMIC_REQUESTS", request.param)
    return bool(request.param)


@pytest.fixture
def api(settings: Any, alias: str, client_kind: str, atomic_requests: bool) -> Api:
    settings.RETRYSAFE = {"STORE": f"django://{alias}"}
    return Api(client_kind)


def _record(alias: str, key: str, path: str = "/orm/orders") -> Any:
    return DjangoStore(alias).get(record_id("", "POST", path, key))


def _orders(alias: str) -> int:
    return int(Order.objects.using(alias).count())


def test_the_migration_creates_the_record_table(alias: str) -> None:
    assert "retrysafe_record" in connections[alias].introspection.table_names()
    out = io.StringIO()
    call_command("sqlmigrate", "retrysafe", "0001", database=alias, stdout=out)
    assert 'CREATE TABLE "retrysafe_record"' in out.getvalue()


def test_the_order_and_the_stored_response_commit_together(api: Api, alias: str) -> None:
    first = api.post(f"/orm/orders?db={alias}", "first", key="k")
    assert first.status_code == 201
    assert _orders(alias) == 1
    record = _record(alias, "k")
    assert record is not None and record.state == "completed"
    again = api.post(f"/orm/orders?db={alias}", "first", key="k")
    assert again["Idempotency-Replayed"] == "true"
    assert again.body == first.body
    assert _orders(alias) == 1


def test_an_exception_after_the_write_rolls_it_back_and_frees_the_key(api: Api, alias: str) -> None:
    assert api.post(f"/orm/orders?db={alias}&fail=1", key="k").status_code == 500
    assert _orders(alias) == 0  # the write was inside the atomic block: rolled back
    assert _record(alias, "k") is None  # released: the retry runs
    assert api.post(f"/orm/orders?db={alias}&fail=1", key="k").status_code == 500
    assert _orders(alias) == 0


def test_a_released_status_rolls_the_write_back(api: Api, alias: str) -> None:
    assert api.post(f"/orm/orders?db={alias}&status=503", key="k").status_code == 503
    assert _orders(alias) == 0
    assert api.post(f"/orm/orders?db={alias}", key="k").status_code == 201
    assert _orders(alias) == 1


def test_async_view_writes_commit_and_roll_back_with_the_record(
    settings: Any, alias: str, client_kind: str
) -> None:
    # Django's async ORM runs in the request's thread-sensitive thread: inside the block. (Django
    # itself refuses ATOMIC_REQUESTS with async views, hence no atomic-requests variant.)
    settings.RETRYSAFE = {"STORE": f"django://{alias}"}
    api = Api(client_kind)
    assert api.post(f"/orm/aorders?db={alias}&fail=1", key="k").status_code == 500
    assert _orders(alias) == 0
    first = api.post(f"/orm/aorders?db={alias}", key="k")
    again = api.post(f"/orm/aorders?db={alias}", key="k")
    assert first.status_code == 201 and again["Idempotency-Replayed"] == "true"
    assert _orders(alias) == 1


@pytest.mark.django_db(transaction=True, databases=["pg"])
def test_a_request_fenced_out_by_a_takeover_rolls_its_write_back(
    settings: Any, client_kind: str
) -> None:
    # PostgreSQL only: on SQLite the takeover's write would wait for the view's transaction.
    settings.RETRYSAFE = {"STORE": "django://pg"}
    api = Api(client_kind)
    store = DjangoStore("pg")
    rid = record_id("", "POST", "/orm/orders", "k")
    entered, release = views.gate("g")
    results: dict[str, Any] = {}

    def first() -> None:
        try:
            results["first"] = api.post("/orm/orders?db=pg&gate=g", key="k")
        finally:
            connections.close_all()

    worker = threading.Thread(target=first)
    worker.start()
    try:
        assert entered.wait(10)
        # Another process took the key over (as after a lapsed lease): a new token holds it.
        assert store.delete(rid)
        assert store.reserve(rid, "other", lease=30, ttl=60).token is not None
    finally:
        release.set()
        worker.join(15)
    fenced = results["first"]
    assert fenced.status_code == 409  # the answer says so; the view's 201 is not sent
    assert _orders("pg") == 0  # its order was rolled back with the failed completion
    record = store.get(rid)
    assert record is not None and record.state == "in_progress" and record.fingerprint == "other"


def test_non_atomic_view_still_commits_with_the_record(api: Api, alias: str) -> None:
    # transaction.non_atomic_requests opts out of ATOMIC_REQUESTS, not of the record's block.
    assert api.post(f"/orm/non-atomic?db={alias}&fail=1", key="k").status_code == 500
    assert _orders(alias) == 0
    assert api.post(f"/orm/non-atomic?db={alias}", key="k").status_code == 201
    assert _orders(alias) == 1


def test_non_transactional_django_store_stores_but_commits_the_write_on_its_own(
    settings: Any, alias: str, client_kind: str
) -> None:
    settings.RETRYSAFE = {"STORE": f"django://{alias}", "TRANSACTIONAL": False}
    api = Api(client_kind)
    assert api.post(f"/orm/orders?db={alias}&fail=1", key="k").status_code == 500
    assert _orders(alias) == 1  # autocommit: the write stayed although the view failed
    assert api.post(f"/orm/orders?db={alias}", key="k").status_code == 201
    assert api.post(f"/orm/orders?db={alias}", key="k")["Idempotency-Replayed"] == "true"
    assert _orders(alias) == 2


@pytest.mark.django_db(transaction=True)
def test_store_operations_follow_the_protocol() -> None:
    store = DjangoStore("default")
    won = store.reserve("r1", "fp", lease=30, ttl=60)
    assert won.token is not None
    held = store.reserve("r1", "fp", lease=30, ttl=60)
    assert held.token is None and held.record is not None
    assert held.record.state == "in_progress" and held.record.lease_remaining > 29
    assert not store.complete("r1", "not-the-token", b"x", ttl=60)  # fenced
    assert store.mark_committed("r1", won.token, lease=0.0)
    record = store.get("r1")
    assert record is not None and record.committed
    assert store.reserve("r1", "fp", lease=30, ttl=60).token is None  # committed: never retaken
    assert store.complete("r1", won.token, b"resp", ttl=60)
    done = store.get("r1")
    assert done is not None and done.state == "completed" and done.response == b"resp"
    assert not store.release("r1", won.token)  # completed records are not released
    assert store.delete("r1") and store.get("r1") is None
    lapsed = store.reserve("r2", "fp", lease=30, ttl=60)
    store._clock = lambda: 10**12  # far future: retention over
    assert store.reserve("r2", "fp", lease=30, ttl=60).token not in (None, lapsed.token)
    assert store.purge_expired() == 0  # r2 was just retaken with a fresh retention


def test_a_sql_url_store_in_transactional_mode_gives_the_view_its_connection(
    settings: Any, client_kind: str, tmp_path: Any
) -> None:
    path = tmp_path / "store.db"
    settings.RETRYSAFE = {"STORE": f"sqlite:///{path}", "TRANSACTIONAL": True}
    api = Api(client_kind)
    assert api.post("/sql/orders?fail=1", "a", key="k").status_code == 500

    def rows() -> list[Any]:
        with sqlite3.connect(path) as conn:
            tables = conn.execute("SELECT name FROM sqlite_master WHERE name = 'sql_orders'")
            if not tables.fetchall():
                return []
            return conn.execute("SELECT item FROM sql_orders").fetchall()

    assert rows() == []  # rolled back with the released key (the table too)
    assert api.post("/sql/orders", "b", key="k").status_code == 201
    assert api.post("/sql/orders", "b", key="k")["Idempotency-Replayed"] == "true"
    assert rows() == [("b",)]
