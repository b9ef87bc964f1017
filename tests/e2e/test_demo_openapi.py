"""The FastAPI OrderHub against its own OpenAPI description, by schemathesis: a real
``retrysafe demo --framework fastapi`` process, every operation of ``/openapi.json`` called with
generated requests. No answer is a 5xx, and every answer (status, content type, headers, body)
is one the description documents.

Each case gets an Idempotency-Key of its own (the generated value plus a unique suffix), so two
different generated bodies never share a key (their 422 would say nothing about the API). The
knobs are tamed: delays of at most 20 ms, and never ``?fail=1``, whose documented 500 is the
knob's purpose, not a defect.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from .servers import DemoServer

pytestmark = pytest.mark.e2e

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
MAX_DELAY_MS = 20
EXAMPLES = 80  # per operation


@pytest.fixture(scope="module")
def fastapi_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoServer]:
    """One FastAPI OrderHub on a fresh SQLite store (transactional: orders in the store's file)."""
    tmp: Path = tmp_path_factory.mktemp("openapi-hub")
    server = DemoServer(
        f"sqlite:///{tmp}/store.db",
        log_dir=tmp / "logs",
        lease=5.0,
        extra_args=("--framework", "fastapi"),
    ).start()
    yield server
    server.stop()
    assert "Traceback" not in server.log_text()


OPERATIONS = [
    ("POST", "/orders"),
    ("POST", "/payments"),
    ("GET", "/orders"),
    ("GET", "/payments"),
    ("GET", "/orders/{record_id}"),
    ("GET", "/payments/{record_id}"),
    ("POST", "/reset"),
]


@pytest.fixture(scope="module")
def openapi(fastapi_hub: DemoServer) -> Any:
    """The OrderHub's own description, as it serves it."""
    return schemathesis.openapi.from_url(fastapi_hub.url + "/openapi.json")


def _tame(case: Any) -> None:
    """A unique key per case; short delays; no deliberate failure."""
    headers = case.headers
    if headers is not None and "Idempotency-Key" in headers:
        headers["Idempotency-Key"] = f"{headers['Idempotency-Key'][:200]}{uuid.uuid4().hex}"
    query = case.query
    if query:
        for knob in ("delay_ms", "delay_after_ms"):
            if isinstance(query.get(knob), int):
                query[knob] = min(query[knob], MAX_DELAY_MS)
        if "fail" in query:
            query["fail"] = False


def test_the_description_has_every_operation(openapi: Any) -> None:
    found = {(op.ok().method.upper(), op.ok().path) for op in openapi.get_all_operations()}
    assert found == set(OPERATIONS)


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_every_answer_is_documented_and_none_is_a_server_error(
    openapi: Any, method: str, path: str
) -> None:
    # schemathesis' own pytest loader (schema.parametrize) does not run under pytest 9, so the
    # operation's strategy is driven by Hypothesis here.
    operation = openapi[path][method]

    @hypothesis.settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(case=operation.as_strategy(GenerationMode.POSITIVE))
    def call(case: Any) -> None:
        _tame(case)
        case.call_and_validate(checks=CHECKS)

    call()


def test_the_description_documents_the_api_the_key_and_the_problems(
    fastapi_hub: DemoServer,
) -> None:
    """What a FastAPI user sees in ``/docs``: every route, the key (required on payments), the
    bearer user, ``Location`` and the problem answers with ``Retry-After``."""
    import httpx

    spec = httpx.get(fastapi_hub.url + "/openapi.json", timeout=10).json()
    assert set(spec["paths"]) == {
        "/orders", "/orders/{record_id}", "/payments", "/payments/{record_id}", "/reset",
    }  # fmt: skip
    required = {}
    for path in ("/orders", "/payments"):
        post = spec["paths"][path]["post"]
        [key] = [p for p in post["parameters"] if p["name"] == "Idempotency-Key"]
        required[path] = key["required"]
        assert post["security"] == [{"HTTPBearer": []}]
        assert "Location" in post["responses"]["201"]["headers"]
        assert set(post["responses"]) >= {"201", "400", "409", "413", "422", "500", "503"}
        for status in ("409", "503"):
            assert "Retry-After" in post["responses"][status]["headers"]
        for status in ("400", "409", "413", "422", "500", "503"):
            assert "application/problem+json" in post["responses"][status]["content"]
    assert required == {"/orders": False, "/payments": True}
    schemas = spec["components"]["schemas"]
    assert schemas["OrderIn"]["required"] == ["item", "quantity"]
    assert schemas["PaymentIn"]["required"] == ["amount", "currency"]
    docs = httpx.get(fastapi_hub.url + "/docs", timeout=10)
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
