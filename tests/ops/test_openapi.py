"""The OpenAPI description FastAPI ``install`` produces: complete for protected operations,
untouched for the others, and valid against the OpenAPI 3.1 schema."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from openapi_spec_validator import validate
from pydantic import BaseModel

from retrysafe._core.problems import PROBLEMS
from retrysafe.contrib.fastapi import idempotent, install

from ..integrations.helpers import client_for, key


class Payment(BaseModel):
    amount: int
    currency: str


def build() -> FastAPI:
    app = FastAPI()
    install(app, store="memory://")

    @app.post("/payments", status_code=201)
    @idempotent(required=True)
    async def pay(payment: Payment) -> dict[str, Any]:
        return {"id": 1}

    @app.patch("/payments/{payment_id}")
    async def amend(payment_id: int, payment: Payment) -> dict[str, Any]:
        return {"id": payment_id}

    @idempotent(enabled=False)
    @app.post("/internal")
    async def internal() -> dict[str, Any]:
        return {}

    @app.get("/payments")
    async def listing() -> dict[str, Any]:
        return {}

    return app


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return build().openapi()


def test_the_schema_validates_against_openapi_3_1(schema: dict[str, Any]) -> None:
    assert schema["openapi"].startswith("3.1")
    validate(schema)  # raises OpenAPIValidationError on any violation


@pytest.mark.parametrize(
    ("path", "method"), [("/payments", "post"), ("/payments/{payment_id}", "patch")]
)
def test_protected_operations_document_every_idempotency_answer(
    schema: dict[str, Any], path: str, method: str
) -> None:
    responses = schema["paths"][path][method]["responses"]
    problem = {"$ref": "#/components/schemas/IdempotencyProblem"}
    for status in ("400", "409", "413", "422", "503"):
        assert responses[status]["content"]["application/problem+json"]["schema"] == problem
    for status in ("409", "503"):
        assert responses[status]["headers"]["Retry-After"]["schema"]["type"] == "integer"
    for status in ("400", "413", "422"):
        assert "Retry-After" not in responses[status].get("headers", {})
    # FastAPI's validation error stays documented beside the idempotency 422.
    assert "application/json" in responses["422"]["content"]
    success = [code for code in responses if code.startswith("2")]
    assert success
    for code in success:
        assert "Idempotency-Replayed" in responses[code]["headers"]


def test_problem_schema_lists_every_code_and_status(schema: dict[str, Any]) -> None:
    problem = schema["components"]["schemas"]["IdempotencyProblem"]
    assert problem["properties"]["code"]["enum"] == sorted(p.code for p in PROBLEMS.values())
    assert set(problem["properties"]["status"]["enum"]) == {400, 409, 413, 422, 503}
    assert {"type", "code", "title", "status"} <= set(problem["required"])


def test_disabled_and_unprotected_operations_document_nothing(schema: dict[str, Any]) -> None:
    clean = FastAPI()

    @clean.post("/internal")
    async def internal() -> dict[str, Any]:
        return {}

    @clean.get("/payments")
    async def listing() -> dict[str, Any]:
        return {}

    plain = clean.openapi()
    assert schema["paths"]["/internal"]["post"] == plain["paths"]["/internal"]["post"]
    assert schema["paths"]["/payments"]["get"] == plain["paths"]["/payments"]["get"]


async def test_documented_answers_are_what_the_app_sends() -> None:
    """The problem bodies on the wire match the documented schema."""
    from jsonschema import validate as validate_json

    app = build()
    problem = app.openapi()["components"]["schemas"]["IdempotencyProblem"]
    async with client_for(app) as client:
        missing = await client.post("/payments", json={"amount": 1, "currency": "EUR"})
        first = await client.post(
            "/payments", json={"amount": 1, "currency": "EUR"}, headers=key("p")
        )
        reused = await client.post(
            "/payments", json={"amount": 2, "currency": "EUR"}, headers=key("p")
        )
        replay = await client.post(
            "/payments", json={"amount": 1, "currency": "EUR"}, headers=key("p")
        )
    assert (missing.status_code, first.status_code, reused.status_code) == (400, 201, 422)
    for answer in (missing, reused):
        assert answer.headers["content-type"] == "application/problem+json"
        validate_json(answer.json(), problem)
    assert replay.headers["idempotency-replayed"] == "true"
