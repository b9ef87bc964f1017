"""Bad input on every shell and store: never a 500 with a traceback, never a duplicate run."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from .conftest import ServiceFactory
from .harness import REPLAYED, World

BODIES = [
    pytest.param(b"{not json", "application/json", id="invalid-json"),
    pytest.param(b'{"item": "caf\xff"}', "application/json", id="json-invalid-utf8"),
    pytest.param(b"[" * 100_000 + b"]" * 100_000, "application/json", id="json-nested-100k"),
    pytest.param(b"", "application/json", id="json-empty"),
    pytest.param(bytes(range(256)) * 64, "application/octet-stream", id="binary"),
    pytest.param(b"\x00\x00\x00", "", id="nul-no-content-type"),
    pytest.param(b"a=1&b=%ZZ", "application/x-www-form-urlencoded", id="form-bad-escape"),
    pytest.param(b"{}", "application/json; charset=\xff", id="content-type-latin1"),
]


@pytest.mark.parametrize("canonical", [False, True], ids=["raw", "canonical"])
@pytest.mark.parametrize(("body", "content_type"), BODIES)
def test_odd_bodies_run_once_and_replay(
    make_service: ServiceFactory, world: World, body: bytes, content_type: str, canonical: bool
) -> None:
    svc = make_service(canonical_json=canonical)
    headers: dict[str, Any] = {"Content-Type": content_type} if content_type else {}
    first = svc.post(key="k1", content=body, headers=headers)
    replay = svc.post(key="k1", content=body, headers=headers)
    other = svc.post(key="k1", content=body + b"!", headers=headers)
    assert first.status_code == 201, first.text
    assert first.json()["sha"] == hashlib.sha256(body).hexdigest()
    assert replay.headers[REPLAYED] == "true"
    assert replay.content == first.content
    assert other.status_code == 422
    assert world["/orders"] == 1


@pytest.mark.parametrize(
    "path",
    [
        "/orders?a=%ZZ&&b",
        "/orders?%ff=%00",
        "/orders/caf%C3%A9",
        "/orders/%E2%82%AC",  # U+20AC: UTF-8 that is not Latin-1 once decoded
        "/orders/%ff",
        "/orders?" + "q" * 4000,
    ],
    ids=["bad-escape", "binary-query", "utf8-path", "euro-path", "latin1-path", "long-query"],
)
def test_odd_paths_and_queries_run_once_and_replay(
    make_service: ServiceFactory, world: World, path: str
) -> None:
    svc = make_service()
    first = svc.post(path, key="k1", content=b"{}")
    replay = svc.post(path, key="k1", content=b"{}")
    assert first.status_code == 201, first.text
    assert replay.headers[REPLAYED] == "true"
    assert replay.content == first.content
    assert sum(n for p, n in world.runs.items() if p != "closed") == 1


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({"Authorization": b"Bearer \xff\xfe"}, id="auth-latin1"),
        pytest.param({"Authorization": ""}, id="auth-empty"),
        pytest.param({"Authorization": "Bearer"}, id="auth-scheme-only"),
        pytest.param({"Content-Length": "000"}, id="content-length-zeros"),
        pytest.param({"X-Odd": "\t spaced \t"}, id="odd-header"),
    ],
)
def test_odd_headers_run_once_and_replay(
    make_service: ServiceFactory, world: World, headers: dict[str, Any]
) -> None:
    svc = make_service()
    body = None if "Content-Length" in headers else b"{}"
    first = svc.post(key="k1", content=body, headers=headers)
    replay = svc.post(key="k1", content=body, headers=headers)
    assert first.status_code == 201, first.text
    assert replay.headers[REPLAYED] == "true"
    assert replay.content == first.content
    assert world["/orders"] == 1


def test_escaped_sf_string_key_is_one_key(make_service: ServiceFactory, world: World) -> None:
    svc = make_service()
    first = svc.post(content=b"{}", headers={"Idempotency-Key": '"a\\"b\\\\c"'})
    replay = svc.post(content=b"{}", headers={"Idempotency-Key": '"a\\"b\\\\c"'})
    assert first.status_code == 201
    assert replay.headers[REPLAYED] == "true"
    assert world["/orders"] == 1
