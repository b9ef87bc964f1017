"""The Flask extension driven by Flask's own test client, on every store (ids memory, sqlite,
postgres, redis): every row of the wire contract, per-view ``@idempotent`` (blueprints and
``MethodView`` too), ``app.config`` settings checked at ``init_app``, the ``flask retrysafe`` CLI
group, and transactional mode (rollback on exception) on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Blueprint, Flask, Response, jsonify, request
from flask.testing import FlaskClient
from flask.views import MethodView

from retrysafe import ConfigurationError
from retrysafe.contrib.flask import (
    Idempotency,
    config_keys,
    idempotent,
    mark_committed,
    transaction,
)
from retrysafe.stores import SQLiteStore

from ..e2e.servers import free_port
from ..stores.backend_postgres import SCHEMA, admin_connect, fresh_table_url
from ..stores.backend_redis import delete_prefixed, unique_prefix, with_prefix

REPLAYED = "Idempotency-Replayed"
ORDER = {"item": "tea", "quantity": 1}


def key(value: str = "key-1") -> dict[str, str]:
    return {"Idempotency-Key": f'"{value}"'}


def problem_type(response: Any) -> str:
    """The slug of an RFC 9457 answer (asserting it is problem+json, never an HTML 500)."""
    assert response.headers["Content-Type"] == "application/problem+json"
    data = json.loads(response.data)
    assert data["status"] == response.status_code
    assert data["title"] and data["detail"]
    slug: str = data["type"].rsplit(":", 1)[-1]
    return slug


@pytest.fixture(params=["memory", "sqlite", "postgres", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A real store of each kind, isolated to this test (own file, table or key prefix)."""
    kind = request.param
    if kind == "memory":
        yield "memory://"
    elif kind == "sqlite":
        yield f"sqlite:///{tmp_path}/store.db"
    elif kind == "postgres":
        yield fresh_table_url(request)
    else:
        base: str = request.getfixturevalue("redis_url")
        prefix = unique_prefix("flask")
        yield with_prefix(base, prefix)
        delete_prefixed(base, prefix)


class Shop:
    """A Flask app under test: how often each view ran, and a gate a slow view waits on."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.started = threading.Event()
        self.gate = threading.Event()
        self.gate.set()

    def hit(self, name: str) -> int:
        with self.lock:
            self.calls[name] += 1
            return self.calls[name]


def build(shop: Shop, config: dict[str, Any] | None = None, **options: Any) -> Flask:
    app = Flask(__name__)
    app.config.update(config or {})

    @app.post("/orders")
    def orders() -> Any:
        n = shop.hit("orders")
        shop.started.set()
        shop.gate.wait(10)
        body = request.get_json(silent=True) or {}
        response = jsonify(id=n, **body)
        response.status_code = 201
        response.headers["Location"] = f"/orders/{n}"
        response.headers["ETag"] = f'"v{n}"'
        response.set_cookie("session", "secret")
        return response

    @app.post("/payments")
    @idempotent(required=True)
    def payments() -> Any:
        return {"id": shop.hit("payments")}, 201

    @app.post("/big")
    def big() -> Any:
        return Response(b"x" * 4096 + str(shop.hit("big")).encode(), 201)

    @app.post("/boom")
    def boom() -> Any:
        shop.hit("boom")
        raise RuntimeError("the view failed")

    @app.post("/error")
    def error() -> Any:
        return {"n": shop.hit("error")}, 500

    shop_bp = Blueprint("shop", __name__, url_prefix="/shop")

    @shop_bp.post("/required")
    @idempotent(required=True)
    def bp_required() -> Any:
        return {"id": shop.hit("bp_required")}, 201

    @shop_bp.post("/off")
    @idempotent(enabled=False)
    def bp_off() -> Any:
        return {"id": shop.hit("bp_off")}, 201

    @shop_bp.post("/plain")
    def bp_plain() -> Any:
        return {"id": shop.hit("bp_plain")}, 201

    @shop_bp.post("/optional")
    @idempotent(required=False)
    def bp_optional() -> Any:
        return {"id": shop.hit("bp_optional")}, 201

    class Refunds(MethodView):
        @idempotent(required=True)
        def post(self) -> Any:
            return {"id": shop.hit("refunds")}, 201

    @idempotent(enabled=False)
    class Notes(MethodView):
        def post(self) -> Any:
            return {"id": shop.hit("notes")}, 201

    app.add_url_rule("/refunds", view_func=Refunds.as_view("refunds"))
    app.add_url_rule("/notes", view_func=Notes.as_view("notes"))
    Idempotency(app, **options)
    # Registered after init_app (application factories often do): still resolved per request.
    app.register_blueprint(shop_bp)
    return app


@pytest.fixture
def make_app() -> Iterator[Callable[..., tuple[Flask, Shop]]]:
    apps: list[Flask] = []

    def make(config: dict[str, Any] | None = None, **options: Any) -> tuple[Flask, Shop]:
        shop = Shop()
        app = build(shop, config, **options)
        apps.append(app)
        return app, shop

    yield make
    for app in apps:
        Idempotency.state(app).store.close()


@pytest.fixture
def shop_app(
    make_app: Callable[..., tuple[Flask, Shop]], store_url: str
) -> tuple[FlaskClient, Shop]:
    app, shop = make_app(store=store_url)
    return app.test_client(), shop


# -- the wire contract, row by row, on every store -------------------------------------------


def test_a_first_request_runs_and_passes_through_unchanged(
    shop_app: tuple[FlaskClient, Shop],
) -> None:
    client, shop = shop_app
    response = client.post("/orders", json=ORDER, headers=key())
    assert response.status_code == 201
    assert response.get_json() == {"id": 1, **ORDER}
    assert response.headers["Location"] == "/orders/1"
    assert "session=secret" in response.headers["Set-Cookie"]
    assert REPLAYED not in response.headers
    assert shop.calls["orders"] == 1


def test_the_same_key_and_request_is_replayed_byte_for_byte_without_running(
    shop_app: tuple[FlaskClient, Shop],
) -> None:
    client, shop = shop_app
    first = client.post("/orders", json=ORDER, headers=key())
    again = client.post("/orders", json=ORDER, headers=key())
    assert again.status_code == 201
    assert again.data == first.data
    for name in ("Location", "ETag", "Content-Type"):
        assert again.headers[name] == first.headers[name]
    assert again.headers[REPLAYED] == "true"
    assert "Set-Cookie" not in again.headers  # credentials are never replayed
    assert shop.calls["orders"] == 1


def _post_in_thread(app_client: FlaskClient, results: list[Any], path: str = "/orders") -> Any:
    def run() -> None:
        results.append(app_client.post(path, json=ORDER, headers=key()))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_the_same_key_while_the_first_runs_is_409_with_retry_after_then_replayed(
    shop_app: tuple[FlaskClient, Shop],
) -> None:
    client, shop = shop_app
    shop.gate.clear()
    results: list[Any] = []
    thread = _post_in_thread(client.application.test_client(), results)
    try:
        assert shop.started.wait(10)
        conflict = client.post("/orders", json=ORDER, headers=key())
        assert conflict.status_code == 409
        assert problem_type(conflict) == "idempotency-request-in-progress"
        assert int(conflict.headers["Retry-After"]) >= 1
    finally:
        shop.gate.set()
        thread.join(10)
    assert results[0].status_code == 201
    replay = client.post("/orders", json=ORDER, headers=key())
    assert replay.headers[REPLAYED] == "true"
    assert replay.data == results[0].data
    assert shop.calls["orders"] == 1


def test_on_conflict_wait_from_app_config_waits_for_the_first_and_replays_it(
    make_app: Callable[..., tuple[Flask, Shop]], store_url: str
) -> None:
    app, shop = make_app({"RETRYSAFE_ON_CONFLICT": "wait"}, store=store_url)
    shop.gate.clear()
    results: list[Any] = []
    thread = _post_in_thread(app.test_client(), results)
    assert shop.started.wait(10)
    threading.Timer(0.3, shop.gate.set).start()
    waited = app.test_client().post("/orders", json=ORDER, headers=key())
    thread.join(10)
    assert waited.status_code == 201
    assert waited.headers[REPLAYED] == "true"
    assert waited.data == results[0].data
    assert shop.calls["orders"] == 1


def test_the_same_key_with_a_different_body_is_422_and_nothing_runs(
    shop_app: tuple[FlaskClient, Shop],
) -> None:
    client, shop = shop_app
    client.post("/orders", json=ORDER, headers=key())
    other = client.post("/orders", json={"item": "coffee", "quantity": 2}, headers=key())
    assert other.status_code == 422
    assert problem_type(other) == "idempotency-key-reused"
    assert shop.calls["orders"] == 1


def test_a_missing_key_on_a_required_view_is_400_and_nothing_runs(
    shop_app: tuple[FlaskClient, Shop],
) -> None:
    client, shop = shop_app
    response = client.post("/payments", json={"amount": 1})
    assert response.status_code == 400
    assert problem_type(response) == "idempotency-key-missing"
    assert shop.calls["payments"] == 0
    assert client.post("/payments", json={"amount": 1}, headers=key()).status_code == 201


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("", id="empty"),
        pytest.param("k" * 256, id="too-long"),
        pytest.param("a\x01b", id="control-char"),
        pytest.param('"unterminated', id="bad-sf-string"),
    ],
)
def test_a_malformed_key_is_400_and_nothing_runs(
    shop_app: tuple[FlaskClient, Shop], value: str
) -> None:
    client, shop = shop_app
    response = client.post("/orders", json=ORDER, headers={"Idempotency-Key": value})
    assert response.status_code == 400
    assert problem_type(response) == "idempotency-key-invalid"
    assert shop.calls["orders"] == 0


def test_a_key_sent_in_two_header_fields_is_400(shop_app: tuple[FlaskClient, Shop]) -> None:
    client, shop = shop_app
    headers = [("Idempotency-Key", '"a"'), ("Idempotency-Key", '"b"')]
    response = client.post("/orders", json=ORDER, headers=headers)
    assert response.status_code == 400
    assert problem_type(response) == "idempotency-key-invalid"
    assert shop.calls["orders"] == 0


def test_a_body_over_the_configured_limit_is_413_and_nothing_runs(
    make_app: Callable[..., tuple[Flask, Shop]], store_url: str
) -> None:
    app, shop = make_app({"RETRYSAFE_MAX_BODY_SIZE": 64}, store=store_url)
    client = app.test_client()
    response = client.post("/orders", data=b"x" * 65, headers=key())
    assert response.status_code == 413
    assert problem_type(response) == "idempotency-request-too-large"
    assert shop.calls["orders"] == 0
    assert client.post("/orders", data=b"x" * 64, headers=key()).status_code == 201


def test_no_key_on_an_optional_view_runs_unprotected_every_time(
    shop_app: tuple[FlaskClient, Shop],
) -> None:
    client, shop = shop_app
    for _ in range(2):
        response = client.post("/orders", json=ORDER)
        assert response.status_code == 201
        assert REPLAYED not in response.headers
    assert shop.calls["orders"] == 2


def test_a_response_over_the_stored_limit_passes_through_and_replays_without_body(
    make_app: Callable[..., tuple[Flask, Shop]], store_url: str
) -> None:
    app, shop = make_app({"RETRYSAFE_MAX_STORED_BODY_SIZE": 1024}, store=store_url)
    client = app.test_client()
    first = client.post("/big", headers=key())
    assert first.status_code == 201
    assert first.data == b"x" * 4096 + b"1"
    replay = client.post("/big", headers=key())
    assert replay.status_code == 201
    assert replay.headers[REPLAYED] == "true"
    assert replay.headers["Idempotency-Body-Omitted"] == "true"
    assert replay.data == b""
    assert shop.calls["big"] == 1


def test_a_view_that_raises_is_answered_500_and_its_key_released_for_a_retry(
    shop_app: tuple[FlaskClient, Shop],
) -> None:
    client, shop = shop_app
    for attempt in (1, 2):
        response = client.post("/boom", headers=key())
        assert response.status_code == 500
        assert shop.calls["boom"] == attempt  # released: the retry ran again
    for attempt in (1, 2):
        assert client.post("/error", headers=key("e")).status_code == 500
        assert shop.calls["error"] == attempt


def test_keys_are_scoped_by_authorization(shop_app: tuple[FlaskClient, Shop]) -> None:
    client, shop = shop_app
    alice = {**key(), "Authorization": "Bearer alice"}
    bob = {**key(), "Authorization": "Bearer bob"}
    first = client.post("/orders", json=ORDER, headers=alice)
    other = client.post("/orders", json=ORDER, headers=bob)
    assert REPLAYED not in other.headers
    assert other.get_json()["id"] == 2
    replay = client.post("/orders", json=ORDER, headers=alice)
    assert replay.headers[REPLAYED] == "true"
    assert replay.data == first.data
    assert shop.calls["orders"] == 2


def test_unprotected_methods_pass_through_with_a_key(shop_app: tuple[FlaskClient, Shop]) -> None:
    client, _ = shop_app
    assert client.get("/orders", headers=key()).status_code == 405
    missing = client.post("/nowhere", headers=key())
    assert missing.status_code == 404  # Flask's own answer: no route, app-wide settings


# -- store unreachable ------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def dead_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/missing-dir/store.db"
    port = free_port()  # nothing listens there
    if request.param == "postgres":
        return f"postgresql://postgres@127.0.0.1:{port}/test?connect_timeout=1"
    return f"redis://127.0.0.1:{port}/0"


def test_an_unreachable_store_is_503_with_retry_after_and_nothing_runs(
    make_app: Callable[..., tuple[Flask, Shop]], dead_store_url: str
) -> None:
    app, shop = make_app(store=dead_store_url, store_retry_after=3)
    response = app.test_client().post("/orders", json=ORDER, headers=key())
    assert response.status_code == 503
    assert problem_type(response) == "idempotency-store-unavailable"
    assert response.headers["Retry-After"] == "3"
    assert shop.calls["orders"] == 0


def test_fail_open_runs_the_view_unprotected_when_the_store_is_unreachable(
    make_app: Callable[..., tuple[Flask, Shop]], dead_store_url: str
) -> None:
    app, shop = make_app({"RETRYSAFE_ON_STORE_ERROR": "fail_open"}, store=dead_store_url)
    response = app.test_client().post("/orders", json=ORDER, headers=key())
    assert response.status_code == 201
    assert shop.calls["orders"] == 1


# -- per-view settings: decorator, blueprints, MethodView -------------------------------------


def test_blueprint_views_carry_their_own_settings(shop_app: tuple[FlaskClient, Shop]) -> None:
    client, shop = shop_app
    missing = client.post("/shop/required")
    assert missing.status_code == 400
    assert problem_type(missing) == "idempotency-key-missing"
    assert shop.calls["bp_required"] == 0
    for _ in range(2):
        off = client.post("/shop/off", headers=key())
        assert REPLAYED not in off.headers
    assert shop.calls["bp_off"] == 2  # opted out: never replayed
    client.post("/shop/plain", headers=key())
    assert client.post("/shop/plain", headers=key()).headers[REPLAYED] == "true"
    assert shop.calls["bp_plain"] == 1


def test_method_views_take_the_mark_of_their_method_or_class(
    shop_app: tuple[FlaskClient, Shop],
) -> None:
    client, shop = shop_app
    assert client.post("/refunds").status_code == 400
    assert shop.calls["refunds"] == 0
    client.post("/notes", headers=key())
    assert REPLAYED not in client.post("/notes", headers=key()).headers
    assert shop.calls["notes"] == 2


def test_a_view_marked_optional_overrides_an_app_wide_required(
    make_app: Callable[..., tuple[Flask, Shop]], tmp_path: Path
) -> None:
    app, shop = make_app({"RETRYSAFE_REQUIRED": True}, store=f"sqlite:///{tmp_path}/s.db")
    client = app.test_client()
    assert problem_type(client.post("/orders", json=ORDER)) == "idempotency-key-missing"
    assert client.post("/shop/optional").status_code == 201
    assert shop.calls == Counter({"bp_optional": 1})


# -- settings: app.config, checked at init_app ------------------------------------------------


def test_settings_come_from_app_config_including_the_store_url(tmp_path: Path) -> None:
    shop = Shop()
    app = build(
        shop,
        {
            "RETRYSAFE_STORE_URL": f"sqlite:///{tmp_path}/cfg.db",
            "RETRYSAFE_METHODS": "POST, PUT",  # as from_prefixed_env gives a plain string
            "RETRYSAFE_TTL": 120,
            "RETRYSAFE_DOCUMENTATION_URL": "https://example.test/keys",
        },
    )
    state = Idempotency.state(app)
    assert isinstance(state.store, SQLiteStore)
    assert state.config.ttl == 120
    assert state.config.methods == frozenset({"POST", "PUT"})
    response = app.test_client().post("/orders", headers={"Idempotency-Key": ""})
    assert response.headers["Link"] == '<https://example.test/keys>; rel="describedby"'
    state.store.close()


def test_keyword_options_win_over_app_config(tmp_path: Path) -> None:
    shop = Shop()
    app = build(
        shop, {"RETRYSAFE_REQUIRED": True}, store=f"sqlite:///{tmp_path}/s.db", required=False
    )
    assert app.test_client().post("/orders", json=ORDER).status_code == 201
    Idempotency.state(app).store.close()


def test_one_extension_sets_up_several_apps_with_their_own_settings(tmp_path: Path) -> None:
    extension = Idempotency()
    first, second = Flask("first"), Flask("second")
    first.config["RETRYSAFE_STORE_URL"] = f"sqlite:///{tmp_path}/a.db"
    second.config.update(RETRYSAFE_STORE_URL=f"sqlite:///{tmp_path}/b.db", RETRYSAFE_REQUIRED=True)
    for app in (first, second):
        app.add_url_rule("/x", "x", lambda: ("ok", 201), methods=["POST"])
        extension.init_app(app)
    assert first.test_client().post("/x").status_code == 201
    assert second.test_client().post("/x").status_code == 400
    for app in (first, second):
        assert Idempotency.state(app).extension is extension
        Idempotency.state(app).store.close()


@pytest.mark.parametrize(
    ("config", "options", "message"),
    [
        pytest.param({"RETRYSAFE_STORE_URL": None}, {}, "RETRYSAFE_STORE_URL", id="no-store"),
        pytest.param({"RETRYSAFE_STORE_URL": ""}, {}, "is empty", id="empty-store-url"),
        pytest.param(
            {"RETRYSAFE_STORE_URL": "cassandra://x"}, {}, "unknown store URL", id="scheme"
        ),
        pytest.param(
            {"RETRYSAFE_TTL": "abc"}, {}, "RETRYSAFE_TTL in app.config: must be seconds", id="type"
        ),
        pytest.param({"RETRYSAFE_REQUIRED": "maybe"}, {}, "must be true or false", id="bool"),
        pytest.param(
            {"RETRYSAFE_TTL": -1}, {}, "RETRYSAFE_TTL in app.config: must be pos", id="value"
        ),
        pytest.param({"RETRYSAFE_TTLL": 60}, {}, "did you mean RETRYSAFE_TTL?", id="typo"),
        pytest.param({"RETRYSAFE_METHODS": 7}, {}, "RETRYSAFE_METHODS in app.config", id="methods"),
        pytest.param({"RETRYSAFE_RELEASE_STATUSES": "4xx"}, {}, "HTTP status codes", id="statuses"),
        pytest.param({"RETRYSAFE_ON_CONFLICT": "queue"}, {}, "'reject' or 'wait'", id="literal"),
        pytest.param(
            {"RETRYSAFE_TRANSACTIONAL": True},
            {},
            "RETRYSAFE_TRANSACTIONAL in app.config: needs a SQL store",
            id="tx-memory",
        ),
        pytest.param(
            {"RETRYSAFE_STORE_URL": "nope://"}, {}, "RETRYSAFE_STORE_URL in app.config", id="url"
        ),
    ],
)
def test_a_bad_setting_fails_at_init_app_with_a_message_naming_it(
    config: dict[str, Any], options: dict[str, Any], message: str
) -> None:
    app = Flask("bad")
    app.config.update({"RETRYSAFE_STORE_URL": "memory://", **config})
    with pytest.raises(ConfigurationError, match=message.replace("[", r"\[")):
        Idempotency(app, **options)
    assert "retrysafe" not in app.extensions
    assert app.wsgi_app.__self__ is app  # type: ignore[attr-defined]  # not wrapped


def test_unknown_or_bad_keyword_options_and_double_set_up_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match=r"Idempotency\(ttl_seconds=...\): unknown option"):
        Idempotency(store="memory://", ttl_seconds=3)
    with pytest.raises(ConfigurationError, match=r"Idempotency\(ttl=...\): must be positive"):
        Idempotency(store="memory://", ttl=0)
    app = Flask("twice")
    Idempotency(app, store="memory://")
    with pytest.raises(ConfigurationError, match="already set up"):
        Idempotency(app, store="memory://")


#: The Flask page of the documentation site, whose table lists every app.config key.
FLASK_PAGE = Path(__file__).resolve().parents[2] / "docs" / "getting-started" / "flask.md"


def test_the_documented_config_keys_are_on_the_flask_page() -> None:
    page = FLASK_PAGE.read_text()
    missing = [k for k in config_keys() if k not in page]
    assert not missing, missing


# -- the flask retrysafe CLI group ------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def shared_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store another client (the CLI) can open by URL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/cli.db"
    elif request.param == "postgres":
        yield fresh_table_url(request)
    else:
        base: str = request.getfixturevalue("redis_url")
        prefix = unique_prefix("flask-cli")
        yield with_prefix(base, prefix)
        delete_prefixed(base, prefix)


def test_the_cli_group_checks_inspects_resolves_and_purges_the_apps_store(
    make_app: Callable[..., tuple[Flask, Shop]], shared_store_url: str
) -> None:
    app, shop = make_app({"RETRYSAFE_STORE_URL": shared_store_url})
    runner = app.test_cli_runner()
    client = app.test_client()
    check = runner.invoke(args=["retrysafe", "check"])
    assert check.exit_code == 0, check.output
    assert "ok:" in check.output

    headers = {**key("cli-1"), "Authorization": "Bearer alice"}
    client.post("/orders", json=ORDER, headers=headers)
    where = ["--key", "cli-1", "--path", "/orders", "--authorization", "Bearer alice"]
    shown = runner.invoke(args=["retrysafe", "inspect", *where])
    assert shown.exit_code == 0, shown.output
    assert "completed" in shown.output and "status: 201" in shown.output
    unscoped = runner.invoke(args=["retrysafe", "inspect", "--key", "cli-1", "--path", "/orders"])
    assert unscoped.exit_code == 1  # another scope: no such record
    assert "none" in unscoped.output
    call = runner.invoke(args=["retrysafe", "inspect", "--key", "cli-1", "--function", "charge"])
    assert call.exit_code == 1 and "none" in call.output  # a call's record, not the request's
    neither = runner.invoke(args=["retrysafe", "inspect", "--key", "cli-1"])
    assert neither.exit_code == 2 and "--path" in neither.output

    refused = runner.invoke(args=["retrysafe", "resolve", *where])
    assert refused.exit_code == 1
    assert "--force" in refused.output
    assert client.post("/orders", json=ORDER, headers=headers).headers[REPLAYED] == "true"
    resolved = runner.invoke(args=["retrysafe", "resolve", *where, "--force"])
    assert resolved.exit_code == 0, resolved.output
    assert "deleted" in resolved.output
    rerun = client.post("/orders", json=ORDER, headers=headers)
    assert REPLAYED not in rerun.headers
    assert shop.calls["orders"] == 2

    purged = runner.invoke(args=["retrysafe", "purge"])
    assert purged.exit_code == 0, purged.output
    assert purged.output.startswith("purged ")


def test_the_cli_fails_with_one_clear_line(tmp_path: Path) -> None:
    app = Flask("cli")
    store = SQLiteStore(tmp_path / "obj.db")
    Idempotency(app, store=store)
    runner = app.test_cli_runner()
    no_url = runner.invoke(args=["retrysafe", "purge"])
    assert no_url.exit_code == 2
    assert "pass --store URL" in no_url.output
    bad = runner.invoke(args=["retrysafe", "check", "--store", "cassandra://x"])
    assert bad.exit_code == 2
    assert bad.output.strip().splitlines() == [
        line for line in bad.output.strip().splitlines() if line.startswith("retrysafe:")
    ]
    assert "unknown store URL scheme" in bad.output
    dead = runner.invoke(args=["retrysafe", "check", "--store", f"redis://127.0.0.1:{free_port()}"])
    assert dead.exit_code == 2
    assert len(dead.output.strip().splitlines()) == 1
    assert dead.output.startswith("retrysafe: ") and "onnect" in dead.output
    given = runner.invoke(args=["retrysafe", "purge", "--store", f"sqlite:///{tmp_path}/obj.db"])
    assert given.exit_code == 0, given.output
    store.close()


# -- transactional mode and mark_committed ----------------------------------------------------


class _Database:
    """The app's own table, in the store's database (SQLite file or PostgreSQL schema)."""

    def __init__(self, kind: str, store_url: str, table: str) -> None:
        self.kind = kind
        self.store_url = store_url
        self.table = table
        self.mark = "?" if kind == "sqlite" else "%s"  # sqlite3, psycopg
        if kind == "sqlite":
            with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
                conn.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, item TEXT)")
        else:
            with admin_connect(store_url) as conn:
                conn.execute(f"CREATE TABLE {table} (id SERIAL PRIMARY KEY, item TEXT)")

    def count(self) -> int:
        sql = f"SELECT count(*) FROM {self.table}"
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.store_url.removeprefix("sqlite:///"))
            try:
                value: int = conn.execute(sql).fetchone()[0]
            finally:
                conn.close()
            return value
        with admin_connect(self.store_url) as pg:
            row = pg.execute(sql).fetchone()
            assert row is not None
            return int(row[0])  # type: ignore[call-overload]


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> _Database:
    if request.param == "sqlite":
        return _Database("sqlite", f"sqlite:///{tmp_path}/tx.db", "items")
    url = fresh_table_url(request)
    return _Database("postgres", url, f'"{SCHEMA}".flask_items_{uuid.uuid4().hex[:8]}')


def _transactional_app(database: _Database, shop: Shop, *, testing: bool) -> Flask:
    app = Flask("tx")
    app.testing = testing  # True: exceptions propagate to the test client (PROPAGATE_EXCEPTIONS)

    @app.post("/items")
    def add_item() -> Any:
        n = shop.hit("items")
        conn = transaction()
        conn.execute(f"INSERT INTO {database.table} (item) VALUES ({database.mark})", ("tea",))
        if request.args.get("fail"):
            raise RuntimeError("failed after writing")
        if request.args.get("status"):
            return {"n": n}, int(request.args["status"])
        return {"n": n}, 201

    @app.post("/loose")
    def loose() -> Any:
        assert transaction(optional=True) is None  # no key: no transaction
        return {"marked": mark_committed()}, 201

    Idempotency(app, store=database.store_url, transactional=True)
    return app


@pytest.mark.parametrize("testing", [False, True], ids=["500-response", "propagated"])
def test_transactional_mode_rolls_the_views_writes_back_when_it_raises(
    database: _Database, testing: bool
) -> None:
    shop = Shop()
    app = _transactional_app(database, shop, testing=testing)
    client = app.test_client()
    if testing:
        with pytest.raises(RuntimeError, match="failed after writing"):
            client.post("/items?fail=1", headers=key())
    else:
        assert client.post("/items?fail=1", headers=key()).status_code == 500
    assert database.count() == 0  # rolled back
    assert client.post("/items?status=503", headers=key("s")).status_code == 503
    assert database.count() == 0  # a released status rolls back too
    # The key was released: the corrected request runs, and its write commits with the record.
    done = client.post("/items?fail=", headers=key())
    assert done.status_code == 201
    assert database.count() == 1
    replay = client.post("/items?fail=", headers=key())
    assert replay.headers[REPLAYED] == "true"
    assert replay.data == done.data
    assert database.count() == 1
    assert shop.calls["items"] == 3
    assert client.post("/loose").get_json() == {"marked": True}
    Idempotency.state(app).store.close()


def test_transaction_outside_transactional_mode_is_a_configuration_error(
    make_app: Callable[..., tuple[Flask, Shop]], tmp_path: Path
) -> None:
    app = Flask("plain")
    app.testing = True

    @app.post("/x")
    def x() -> Any:
        transaction()
        return "", 201

    Idempotency(app, store=f"sqlite:///{tmp_path}/p.db")
    with pytest.raises(ConfigurationError, match="no idempotent transaction"):
        app.test_client().post("/x", headers=key())
    Idempotency.state(app).store.close()


def test_mark_committed_makes_a_crashed_requests_key_outcome_unknown(
    store_url: str, tmp_path: Path
) -> None:
    # The view marks its effect and then "dies" (its lease ends without a response stored,
    # here because it raises after the mark): the key is never run again.
    app = Flask("marks")
    calls = Counter[str]()

    @app.post("/charge")
    def charge() -> Any:
        calls["charge"] += 1
        assert mark_committed() is True
        raise RuntimeError("died after the effect")

    Idempotency(app, store=store_url)
    client = app.test_client()
    assert client.post("/charge", headers=key()).status_code == 500
    # The Redis store floors an ended lease to 1 ms (stores/redis.py _ms), so a retry within
    # that millisecond is "in progress" rather than "outcome unknown" (a 409 either way).
    time.sleep(0.01)
    again = client.post("/charge", headers=key())
    assert again.status_code == 409
    assert problem_type(again) == "idempotency-outcome-unknown"
    assert calls["charge"] == 1
    Idempotency.state(app).store.close()


def test_a_scope_resolver_and_an_event_hook_from_app_config_are_used(tmp_path: Path) -> None:
    events: list[str] = []
    shop = Shop()
    app = build(
        shop,
        {
            "RETRYSAFE_STORE_URL": f"sqlite:///{tmp_path}/scoped.db",
            "RETRYSAFE_SCOPE_RESOLVER": lambda req: req.header("X-Tenant") or "",
            "RETRYSAFE_ON_EVENT": lambda event, details: events.append(event),
        },
    )
    client = app.test_client()
    acme, umbrella = {**key(), "X-Tenant": "acme"}, {**key(), "X-Tenant": "umbrella"}
    client.post("/orders", json=ORDER, headers=acme)
    assert REPLAYED not in client.post("/orders", json=ORDER, headers=umbrella).headers
    assert client.post("/orders", json=ORDER, headers=acme).headers[REPLAYED] == "true"
    assert shop.calls["orders"] == 2
    assert "replayed" in events
    Idempotency.state(app).store.close()


def test_replay_headers_from_the_environment_form_keep_their_order() -> None:
    app = Flask(__name__)
    app.config["RETRYSAFE_STORE_URL"] = "memory://"
    app.config["RETRYSAFE_REPLAY_HEADERS"] = "Idempotency-Replayed, Idempotent-Replayed"

    @app.post("/orders")
    def orders() -> tuple[str, int]:
        return "ok", 201

    Idempotency(app)
    client = app.test_client()
    client.post("/orders", headers={"Idempotency-Key": "k"})
    replay = client.post("/orders", headers={"Idempotency-Key": "k"})
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.headers["Idempotency-Replayed"] == "true"
