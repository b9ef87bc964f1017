"""OrderHub's domain (``retrysafe.demo.domain``): what every framework's OrderHub shares, one test
per rule; and the promise that importing the demo (or building the command's parser) loads no
framework."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from retrysafe.demo.domain import (
    MAX_DELAY_MS,
    MAX_NUMBER,
    ORDERS,
    PAYMENTS,
    DatabaseUnavailable,
    DemoFailure,
    Knobs,
    Problem,
    default_db_url,
    describe_data,
    owner,
    parse_limit,
    parse_record,
    problem_of,
    same_database,
)


def _problem(body: bytes, kind: object = ORDERS) -> Problem:
    with pytest.raises(Problem) as caught:
        parse_record(kind, body)  # type: ignore[arg-type]
    return caught.value


def test_a_valid_order_keeps_its_fields_and_drops_other_members() -> None:
    body = b'{"item": "tea", "quantity": 2, "note": "x"}'
    assert parse_record(ORDERS, body) == {"item": "tea", "quantity": 2}
    assert parse_record(PAYMENTS, b'{"amount": 5, "currency": "EUR"}') == {
        "amount": 5,
        "currency": "EUR",
    }


@pytest.mark.parametrize("body", [b"not json", b"{", b"\xff\xfe", b"[" * 100_000])
def test_a_body_that_is_not_json_is_400(body: bytes) -> None:
    problem = _problem(body)
    assert (problem.status, problem.title) == (400, "Body is not JSON")


@pytest.mark.parametrize(
    "body",
    [
        b"[1, 2]",
        b'{"item": "tea"}',
        b'{"item": 1, "quantity": 1}',
        b'{"item": "tea", "quantity": true}',
        b'{"item": "tea", "quantity": 1.0}',
        b'{"item": "tea", "quantity": "1"}',
        b'{"item": "tea", "quantity": 0}',
        b'{"item": "tea", "quantity": 9007199254740992}',
        b'{"item": "", "quantity": 1}',
        b'{"item": "a\\u0000b", "quantity": 1}',
        b'{"item": "\\ud800", "quantity": 1}',
    ],
    ids=[
        "array", "missing", "wrong-type", "bool", "float", "string-number", "zero",
        "over-2**53-1", "empty", "nul", "lone-surrogate",
    ],
)  # fmt: skip
def test_a_json_body_that_is_not_a_valid_order_is_422_naming_the_field(body: bytes) -> None:
    problem = _problem(body)
    assert (problem.status, problem.title) == (422, "Invalid order")
    data = json.loads(problem.body())
    assert data == {
        "type": "urn:orderhub:problem:invalid-request",
        "title": "Invalid order",
        "status": 422,
        "detail": problem.detail,
    }
    if body.startswith(b"{"):
        assert "'item'" in problem.detail or "'quantity'" in problem.detail


def test_the_largest_number_is_accepted() -> None:
    body = json.dumps({"amount": MAX_NUMBER, "currency": "EUR"}).encode()
    assert parse_record(PAYMENTS, body)["amount"] == MAX_NUMBER


def test_knobs_are_read_as_milliseconds_and_a_flag() -> None:
    query = {"delay_ms": "250", "delay_after_ms": "1000", "fail": "1"}
    assert Knobs.from_query(query.get) == Knobs(0.25, 1.0, True)
    assert Knobs.from_query({}.get) == Knobs()
    assert Knobs.from_query({"fail": "false"}.get).fail is False
    assert Knobs.from_query({"delay_ms": str(MAX_DELAY_MS)}.get).delay == MAX_DELAY_MS / 1000


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("delay_ms", "abc"),
        ("delay_ms", "-1"),
        ("delay_after_ms", str(MAX_DELAY_MS + 1)),
        ("fail", "maybe"),
    ],
)
def test_an_unreadable_knob_is_a_400_naming_it(name: str, value: str) -> None:
    with pytest.raises(Problem) as caught:
        Knobs.from_query({name: value}.get)
    assert caught.value.status == 400
    assert name in caught.value.title


def test_fail_raises_a_demo_failure_answered_500() -> None:
    with pytest.raises(DemoFailure) as caught:
        Knobs(fail=True).fail_if_asked(PAYMENTS)
    problem = problem_of(caught.value)
    assert (problem.status, problem.title, problem.retry_after) == (500, "Handler failed", None)
    Knobs().fail_if_asked(PAYMENTS)  # no knob: nothing raised


def test_a_busy_database_is_a_503_with_retry_after() -> None:
    problem = problem_of(DatabaseUnavailable("locked", store="sqlite"))
    assert (problem.status, problem.slug) == (503, "database-unavailable")
    assert problem.headers() == {"Retry-After": "1"}


def test_limit_is_a_whole_number_from_zero() -> None:
    assert parse_limit(None) is None
    assert parse_limit("0") == 0
    for bad in ("-1", "x", "1.5"):
        with pytest.raises(Problem):
            parse_limit(bad)


@pytest.mark.parametrize(
    ("authorization", "name"),
    [
        ("Bearer alice", "alice"),
        ("bearer  bob ", "bob"),
        ("Basic YWxpY2U=", "anonymous"),
        ("Bearer ", "anonymous"),
        (None, "anonymous"),
    ],
)
def test_the_demo_user_is_the_bearer_name(authorization: str | None, name: str) -> None:
    assert owner(authorization) == name


def test_orders_live_in_the_sql_store_s_own_database_by_default() -> None:
    assert default_db_url("sqlite:///./x.db?busy_timeout=1") == "sqlite:///./x.db?busy_timeout=1"
    assert default_db_url("redis://localhost:6379/0") == "sqlite:///./orderhub.db"
    assert default_db_url("memory://") == "sqlite:///./orderhub.db"
    pg = "postgres://u@h/db?table=t"
    assert default_db_url(pg) == pg and same_database(pg, "postgresql://u@h/db")


def test_same_database_compares_files_not_spellings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir("/tmp")
    assert same_database("sqlite:///x.db?busy_timeout=1", "sqlite:////tmp/x.db")
    assert not same_database("sqlite:///x.db", "sqlite:///y.db")
    assert not same_database("redis://h/0", "sqlite:///x.db")


def test_the_page_names_the_data_and_hides_passwords() -> None:
    text = describe_data("postgresql://u:secret@h/db?table=t", "sqlite:////tmp/orders.db")
    assert "secret" not in text and "u:***@h/db" in text
    assert "/tmp/orders.db" in text and "new, empty folder" in text


def test_the_fastapi_models_take_the_domain_s_fields() -> None:
    from retrysafe.demo.fastapi_app import OrderIn, PaymentIn

    for model, kind in ((OrderIn, ORDERS), (PaymentIn, PAYMENTS)):
        fields = {name: field.annotation for name, field in model.model_fields.items()}
        assert fields == dict(kind.fields)


def test_importing_the_demo_and_building_the_command_loads_no_framework() -> None:
    code = (
        "import sys, retrysafe.demo, retrysafe.demo.domain, retrysafe.demo.serve, retrysafe.cli\n"
        "retrysafe.cli.build_parser()\n"
        "names = ('starlette', 'fastapi', 'flask', 'django', 'pydantic', 'uvicorn', 'gunicorn',\n"
        "         'celery', 'kombu')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in names))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"


def test_the_django_orderhub_s_migrations_match_its_models(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "retrysafe.demo.django_app.settings",
        "RETRYSAFE_DEMO_STORE": f"sqlite:///{tmp_path}/store.db",
    }
    command = [sys.executable, "-m", "django", "makemigrations", "--check", "--dry-run", "orderhub"]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_worker_s_broker_is_a_folder_unless_a_url_names_one(tmp_path: Path) -> None:
    from retrysafe.demo.charges import DEFAULT_BROKER, broker_options, worker_command

    assert DEFAULT_BROKER.startswith("filesystem://")
    url, options = broker_options(f"filesystem://{tmp_path}/broker")
    assert url == "filesystem://"
    assert options["data_folder_in"] == options["data_folder_out"] == f"{tmp_path}/broker/queue"
    assert (tmp_path / "broker" / "queue").is_dir() and (tmp_path / "broker" / "control").is_dir()
    assert broker_options("redis://127.0.0.1:6379/1") == ("redis://127.0.0.1:6379/1", {})
    command = worker_command()
    assert command[1:6] == ["-m", "celery", "-A", "retrysafe.demo.worker", "worker"]
    assert command[command.index("--pool") + 1] == "prefork"


def test_the_demo_starts_its_worker_only_where_it_can_share_the_keys() -> None:
    import argparse

    from retrysafe.demo.serve import worker_link

    def args(**given: object) -> argparse.Namespace:
        base = {"no_worker": False, "framework": "starlette", "store": "sqlite:///x.db"}
        return argparse.Namespace(**{**base, "broker": "filesystem://b", **given})

    link = worker_link(args())
    assert link is not None and link.broker == "filesystem://b" and link.worker_pid is None
    assert worker_link(args(no_worker=True)) is None
    assert worker_link(args(framework="django")) is None  # not yet
    assert worker_link(args(store="memory://")) is None  # each process its own memory


def test_the_worker_s_mysql_inserts_read_their_id_back_without_returning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MySQL 8 has no ``RETURNING`` (MariaDB has): each insert of the worker's charges and
    runs is followed by the read of its row by ``LAST_INSERT_ID()``, on the same connection."""
    from retrysafe.demo._drivers import MYSQL_THEN
    from retrysafe.demo.charges import ChargeBook

    book = ChargeBook("mysql://root@db.example/shop")  # PyMySQL connects on first use
    sent: list[str] = []

    def run(sql: str, params: object = (), **_: object) -> list[tuple[int]]:
        sent.append(sql)
        return [(7,)]

    monkeypatch.setattr(book._driver, "run", run)
    assert book.charge("retrysafe", 1, 10, "EUR", "task", conn=None) == 7
    assert book.start_run("retrysafe", 1, "task", 42) == 7
    for sql, stamp in zip(sent, ("created_at", "started_at"), strict=True):
        insert, read = sql.split(MYSQL_THEN)
        assert "RETURNING" not in sql.upper()
        assert insert.startswith("INSERT INTO orderhub_") and stamp in insert
        assert read.endswith("WHERE id = LAST_INSERT_ID()")
