"""retrysafe.contrib.fastapi: install() + @idempotent on FastAPI routes, and the OpenAPI schema."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Response
from pydantic import BaseModel

from retrysafe import ConfigurationError, IdempotencyConfig
from retrysafe.contrib.fastapi import Transaction, idempotent, install
from retrysafe.stores import AsyncSQLiteStore, AsyncStore

from .helpers import REPLAYED, Calls, client_for, key, make_store, problem_type


class Payment(BaseModel):
    amount: int
    currency: str


def build_app(store: AsyncStore, calls: Calls, **options: Any) -> FastAPI:
    app = FastAPI()
    install(app, store=store, **options)

    @app.post("/payments", status_code=201)
    @idempotent(required=True)
    async def pay(payment: Payment, response: Response) -> dict[str, Any]:
        n = calls.hit("payments")
        response.headers["Location"] = f"/payments/{n}"
        return {"id": n, "amount": payment.amount, "currency": payment.currency}

    @app.post("/orders", status_code=201)
    async def order(payment: Payment) -> dict[str, Any]:
        return {"id": calls.hit("orders")}

    @idempotent(enabled=False)
    @app.post("/internal")
    async def internal() -> dict[str, Any]:
        return {"id": calls.hit("internal")}

    @app.get("/payments")
    async def list_payments() -> dict[str, Any]:
        return {"count": calls["payments"]}

    return app


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AsyncStore]:
    made = make_store(request.param, tmp_path)
    yield made
    await made.aclose()


PAYMENT = {"amount": 1200, "currency": "EUR"}


async def test_required_route_rejects_a_request_without_key(store: AsyncStore) -> None:
    calls = Calls()
    async with client_for(build_app(store, calls)) as client:
        response = await client.post("/payments", json=PAYMENT)
    assert response.status_code == 400
    assert problem_type(response) == "idempotency-key-missing"
    assert calls["payments"] == 0


async def test_required_route_runs_once_and_replays(store: AsyncStore) -> None:
    calls = Calls()
    async with client_for(build_app(store, calls)) as client:
        first = await client.post("/payments", json=PAYMENT, headers=key())
        replay = await client.post("/payments", json=PAYMENT, headers=key())
        listing = await client.get("/payments")
    assert first.status_code == 201
    assert first.headers["location"] == "/payments/1"
    assert replay.status_code == 201
    assert replay.content == first.content
    assert replay.headers["location"] == "/payments/1"
    assert replay.headers[REPLAYED] == "true"
    assert listing.json() == {"count": 1}


async def test_validation_error_releases_the_key_so_the_corrected_request_runs(
    store: AsyncStore,
) -> None:
    calls = Calls()
    async with client_for(build_app(store, calls)) as client:
        invalid = await client.post("/payments", json={"amount": "lots"}, headers=key())
        corrected = await client.post("/payments", json=PAYMENT, headers=key())
        replay = await client.post("/payments", json=PAYMENT, headers=key())
    assert invalid.status_code == 422
    assert REPLAYED not in invalid.headers
    assert corrected.status_code == 201
    assert replay.headers[REPLAYED] == "true"
    assert calls["payments"] == 1


async def test_different_body_with_the_same_key_is_422_reused(store: AsyncStore) -> None:
    calls = Calls()
    async with client_for(build_app(store, calls)) as client:
        await client.post("/payments", json=PAYMENT, headers=key())
        reused = await client.post("/payments", json={**PAYMENT, "amount": 1}, headers=key())
    assert reused.status_code == 422
    assert problem_type(reused) == "idempotency-key-reused"
    assert calls["payments"] == 1


async def test_opted_out_route_runs_every_time(store: AsyncStore) -> None:
    calls = Calls()
    async with client_for(build_app(store, calls, required=True)) as client:
        a = await client.post("/internal", headers=key())
        b = await client.post("/internal")
    assert (a.json(), b.json()) == ({"id": 1}, {"id": 2})


def _key_parameters(schema: dict[str, Any], path: str, method: str) -> list[dict[str, Any]]:
    operation = schema["paths"][path][method]
    return [p for p in operation.get("parameters", []) if p["name"] == "Idempotency-Key"]


async def test_openapi_documents_the_header_with_the_right_required_flag(
    store: AsyncStore,
) -> None:
    app = build_app(store, Calls())
    async with client_for(app) as client:
        schema = (await client.get("/openapi.json")).json()
        again = (await client.get("/openapi.json")).json()
    [payments] = _key_parameters(schema, "/payments", "post")
    assert payments["in"] == "header"
    assert payments["required"] is True
    assert payments["schema"] == {"type": "string", "minLength": 1, "maxLength": 255}
    [orders] = _key_parameters(schema, "/orders", "post")
    assert orders["required"] is False
    assert _key_parameters(schema, "/internal", "post") == []
    assert _key_parameters(schema, "/payments", "get") == []
    assert again == schema


async def test_openapi_marks_every_protected_route_required_when_required_app_wide(
    store: AsyncStore,
) -> None:
    schema = build_app(store, Calls(), required=True).openapi()
    [orders] = _key_parameters(schema, "/orders", "post")
    assert orders["required"] is True


def test_install_rejects_config_together_with_options() -> None:
    with pytest.raises(ConfigurationError):
        install(FastAPI(), store="memory://", config=IdempotencyConfig(), required=True)


def test_install_rejects_bad_settings_at_start_up() -> None:
    with pytest.raises(ConfigurationError):
        install(FastAPI(), store="memory://", lease=-1)


class PaymentIn(BaseModel):
    amount: int


async def test_transaction_dependency_commits_the_endpoint_writes_with_the_record(
    tmp_path: Path,
) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE pay (id INTEGER PRIMARY KEY, amount INTEGER)")
    app = FastAPI()
    install(app, store=AsyncSQLiteStore(path), transactional=True)
    fail = {"on": True}

    @app.post("/pay", status_code=201)
    @idempotent(required=True)
    async def pay(payment: PaymentIn, conn: Transaction) -> dict[str, int]:
        row = conn.execute(
            "INSERT INTO pay (amount) VALUES (?) RETURNING id", (payment.amount,)
        ).fetchone()
        if fail["on"]:
            raise RuntimeError("after the write")
        return {"id": row[0]}

    def rows() -> list[tuple[int, int]]:
        with sqlite3.connect(path) as check:
            return check.execute("SELECT id, amount FROM pay").fetchall()

    async with client_for(app) as client:
        failed = await client.post("/pay", json={"amount": 5}, headers=key("f1"))
        assert failed.status_code == 500 and rows() == []
        fail["on"] = False
        first = await client.post("/pay", json={"amount": 5}, headers=key("f1"))
        again = await client.post("/pay", json={"amount": 5}, headers=key("f1"))
    assert first.status_code == 201 and again.headers[REPLAYED] == "true"
    assert [amount for _, amount in rows()] == [5]
