"""Bad input never leads to a 500 traceback or a duplicate: 1 MiB bodies at the default limit,
non-JSON and invalid JSON bodies, binary bodies, odd headers."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request, Response
from pydantic import BaseModel

from retrysafe.contrib.fastapi import install
from retrysafe.stores import AsyncStore

from .helpers import REPLAYED, Calls, body_then, client_for, drive, http_scope, key, make_store

MIB = 1024 * 1024


class Order(BaseModel):
    item: str
    quantity: int


def build_app(store: AsyncStore, calls: Calls, **options: Any) -> FastAPI:
    app = FastAPI()
    install(app, store=store, **options)

    @app.post("/orders", status_code=201)
    async def create(order: Order) -> dict[str, Any]:
        return {"id": calls.hit("orders"), "size": len(order.item)}

    @app.post("/blobs", status_code=201)
    async def blob(request: Request) -> Response:
        body = await request.body()
        n = calls.hit("blobs")
        return Response(body[::-1], status_code=201, headers={"X-Sha": _sha(body), "X-N": str(n)})

    return app


def _sha(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def json_of_size(size: int) -> bytes:
    """A valid order whose JSON encoding is exactly ``size`` bytes."""
    empty = json.dumps({"item": "", "quantity": 1}).encode()
    body = json.dumps({"item": "a" * (size - len(empty)), "quantity": 1}).encode()
    assert len(body) == size
    return body


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AsyncStore]:
    made = make_store(request.param, tmp_path)
    yield made
    await made.aclose()


JSON_HEADERS = {**key(), "Content-Type": "application/json"}


async def test_json_body_of_exactly_1_mib_is_accepted_at_the_default_limit(
    store: AsyncStore,
) -> None:
    calls = Calls()
    body = json_of_size(MIB)
    async with client_for(build_app(store, calls)) as client:
        first = await client.post("/orders", content=body, headers=JSON_HEADERS)
        replay = await client.post("/orders", content=body, headers=JSON_HEADERS)
    assert first.status_code == 201
    assert first.json()["size"] == MIB - len(b'{"item": "", "quantity": 1}')
    assert replay.headers[REPLAYED] == "true"
    assert calls["orders"] == 1


async def test_json_body_one_byte_over_1_mib_is_413(store: AsyncStore) -> None:
    calls = Calls()
    body = json_of_size(MIB + 1)

    async def chunked() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 64 * 1024):
            yield body[start : start + 64 * 1024]

    async with client_for(build_app(store, calls)) as client:
        with_length = await client.post("/orders", content=body, headers=JSON_HEADERS)
        without_length = await client.post("/orders", content=chunked(), headers=JSON_HEADERS)
    assert with_length.status_code == 413
    assert without_length.status_code == 413
    assert "content-length" not in without_length.request.headers
    assert with_length.headers["content-type"] == "application/problem+json"
    assert calls["orders"] == 0


@pytest.mark.parametrize("canonical_json", [False, True])
@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        (b"item=pen&quantity=1", "application/x-www-form-urlencoded"),
        (b"just text", "text/plain"),
        (b'{"item": "pen", "quantity": ', "application/json"),
        (b"\xff\xfe\x00\x01garbage\x80", "application/json"),
        (b"[" * 50_000 + b"]" * 50_000, "application/json"),
        (b"", "application/json"),
    ],
    ids=["form", "text", "invalid-json", "binary-as-json", "deep-json", "empty"],
)
async def test_bodies_the_handler_rejects_get_its_error_and_never_a_500(
    store: AsyncStore, content: bytes, content_type: str, canonical_json: bool
) -> None:
    calls = Calls()
    headers = {**key(), "Content-Type": content_type}
    app = build_app(store, calls, canonical_json=canonical_json)
    async with client_for(app) as client:
        first = await client.post("/orders", content=content, headers=headers)
        again = await client.post("/orders", content=content, headers=headers)
        corrected = await client.post("/orders", json={"item": "pen", "quantity": 1}, headers=key())
        replay = await client.post("/orders", json={"item": "pen", "quantity": 1}, headers=key())
    # FastAPI's own answer (422 invalid, 400 unparseable); released, so the same key is usable
    # once the request is corrected.
    assert first.status_code == again.status_code
    assert first.status_code in {400, 422}
    assert REPLAYED not in again.headers
    assert corrected.status_code == 201
    assert replay.headers[REPLAYED] == "true"
    assert calls["orders"] == 1


@pytest.mark.parametrize("canonical_json", [False, True])
async def test_binary_bodies_are_stored_and_replayed_byte_exact(
    store: AsyncStore, canonical_json: bool
) -> None:
    calls = Calls()
    body = bytes(range(256)) * 64 + os.urandom(1000)
    headers = {**key(), "Content-Type": "application/octet-stream"}
    async with client_for(build_app(store, calls, canonical_json=canonical_json)) as client:
        first = await client.post("/blobs", content=body, headers=headers)
        replay = await client.post("/blobs", content=body, headers=headers)
        changed = await client.post(
            "/blobs", content=body[:-1] + bytes([body[-1] ^ 1]), headers=headers
        )
    assert first.status_code == 201
    assert first.content == body[::-1]
    assert first.headers["x-sha"] == _sha(body)
    assert replay.content == first.content
    assert replay.headers["x-sha"] == first.headers["x-sha"]
    assert replay.headers[REPLAYED] == "true"
    assert changed.status_code == 422
    assert calls["blobs"] == 1


async def test_unparseable_content_length_does_not_break_the_request(store: AsyncStore) -> None:
    calls = Calls()
    app = build_app(store, calls)
    headers = [(b"idempotency-key", b"k"), (b"content-length", b"lots")]
    messages = await drive(app, http_scope("POST", "/blobs", headers), body_then(b"abc"))
    assert messages[0]["status"] == 201
    assert calls["blobs"] == 1


async def test_many_malformed_keys_never_give_a_500(store: AsyncStore) -> None:
    calls = Calls()
    bad = [b"", b" ", b'"', b'""', b'"\\x"', b"k" * 10_000, b"\x00", b"a\r", b"\xc0\xaf", b'"a"b']
    async with client_for(build_app(store, calls)) as client:
        statuses = {
            (
                await client.post("/blobs", content=b"x", headers=[(b"Idempotency-Key", value)])
            ).status_code
            for value in bad
        }
    assert statuses == {400}
    assert calls["blobs"] == 0
