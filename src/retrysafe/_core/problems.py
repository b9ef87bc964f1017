"""RFC 9457 problem+json error responses with stable ``type`` identifiers and ``code`` members.

Every body carries ``type`` (a URI: ``problem_type_base`` + slug) and, beside it, ``code``: the
same identity as a plain snake_case token, for clients that switch on a string and would rather
not parse a URI whose prefix the server may configure. Codes never change once published (the
documentation's Problem types pages, docs/reference/problems/, list them: generated from
``PROBLEMS`` and ``PROXY_PROBLEMS`` when the site is built).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["PROBLEMS", "PROXY_PROBLEMS", "Problem", "render_problem"]


@dataclass(frozen=True, slots=True)
class Problem:
    """One kind of error answer.

    Attributes:
        slug: the stable last part of the problem ``type``.
        status: the HTTP status.
        title: a short, fixed summary.
        code: the stable machine-readable ``code`` member (snake_case).
    """

    slug: str
    status: int
    title: str
    code: str


PROBLEMS: dict[str, Problem] = {
    p.slug: p
    for p in (
        Problem(
            "idempotency-key-missing",
            400,
            "Idempotency-Key is missing",
            "idempotency_key_missing",
        ),
        Problem(
            "idempotency-key-invalid",
            400,
            "Idempotency-Key is malformed",
            "idempotency_key_invalid",
        ),
        Problem(
            "idempotency-key-reused",
            422,
            "Idempotency-Key is already used",
            "idempotency_key_reused",
        ),
        Problem(
            "idempotency-request-in-progress",
            409,
            "A request is outstanding for this Idempotency-Key",
            "idempotency_request_in_progress",
        ),
        Problem(
            "idempotency-request-too-large",
            413,
            "Request body is too large",
            "idempotency_request_too_large",
        ),
        Problem(
            "idempotency-store-unavailable",
            503,
            "Idempotency store is unavailable",
            "idempotency_store_unavailable",
        ),
        Problem(
            "idempotency-outcome-unknown",
            409,
            "The outcome of the first request with this Idempotency-Key is unknown",
            "idempotency_outcome_unknown",
        ),
    )
}


#: The answers of ``retrysafe proxy`` about its upstream (never given by the middleware, so not in
#: the middleware's OpenAPI description).
PROXY_PROBLEMS: dict[str, Problem] = {
    p.slug: p
    for p in (
        Problem(
            "upstream-unreachable", 502, "The upstream cannot be reached", "upstream_unreachable"
        ),
        Problem("upstream-no-answer", 502, "The upstream gave no answer", "upstream_no_answer"),
        Problem("upstream-timeout", 504, "The upstream did not answer in time", "upstream_timeout"),
    )
}


def render_problem(
    slug: str,
    detail: str,
    *,
    type_base: str,
    documentation_url: str | None = None,
    retry_after: int | None = None,
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Build a problem+json response.

    Args:
        slug: a key of :data:`PROBLEMS`.
        detail: the occurrence-specific explanation.
        type_base: prefix of the ``type`` URI.
        documentation_url: adds ``Link: <url>; rel="describedby"`` when given.
        retry_after: adds ``Retry-After`` (seconds) when given.

    Returns:
        ``(status, headers, body)``.
    """
    problem = PROBLEMS.get(slug) or PROXY_PROBLEMS[slug]
    body = json.dumps(
        {
            "type": type_base + slug,
            "code": problem.code,
            "title": problem.title,
            "status": problem.status,
            "detail": detail,
        },
        separators=(",", ":"),
    ).encode()
    headers = [
        (b"content-type", b"application/problem+json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    if documentation_url:
        headers.append((b"link", f'<{documentation_url}>; rel="describedby"'.encode()))
    return problem.status, headers, body
