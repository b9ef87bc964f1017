"""RFC 9457 problem+json error bodies."""

from __future__ import annotations

import json

import pytest

from retrysafe._core.problems import PROBLEMS, render_problem


def headers_of(raw: list[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    assert len({name for name, _ in raw}) == len(raw), "a header appears twice"
    return dict(raw)


@pytest.mark.parametrize("slug", sorted(PROBLEMS))
def test_every_problem_renders_rfc9457_fields(slug: str) -> None:
    status, raw, body = render_problem(slug, "what happened", type_base="urn:x:")
    headers = headers_of(raw)
    data = json.loads(body)
    assert data == {
        "type": "urn:x:" + slug,
        "code": PROBLEMS[slug].code,
        "title": PROBLEMS[slug].title,
        "status": status,
        "detail": "what happened",
    }
    assert status == PROBLEMS[slug].status
    assert headers[b"content-type"] == b"application/problem+json"
    assert headers[b"content-length"] == str(len(body)).encode()
    assert b"retry-after" not in headers
    assert b"link" not in headers


@pytest.mark.parametrize(
    ("slug", "status"),
    [
        ("idempotency-key-missing", 400),
        ("idempotency-key-invalid", 400),
        ("idempotency-key-reused", 422),
        ("idempotency-request-in-progress", 409),
        ("idempotency-request-too-large", 413),
        ("idempotency-store-unavailable", 503),
    ],
)
def test_problem_statuses_follow_the_wire_contract(slug: str, status: int) -> None:
    assert PROBLEMS[slug].status == status


def test_retry_after_and_describedby_link_are_added_when_given() -> None:
    _, raw, _ = render_problem(
        "idempotency-request-in-progress",
        "later",
        type_base="https://errors.example/",
        documentation_url="https://docs.example/idempotency",
        retry_after=7,
    )
    headers = headers_of(raw)
    assert headers[b"retry-after"] == b"7"
    assert headers[b"link"] == b'<https://docs.example/idempotency>; rel="describedby"'


def test_detail_with_quotes_and_non_ascii_is_valid_json() -> None:
    _, _, body = render_problem("idempotency-key-invalid", 'bad "key" \u00e9', type_base="")
    assert json.loads(body)["detail"] == 'bad "key" \u00e9'
