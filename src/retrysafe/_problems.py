"""RFC 9457 problem+json error responses with stable ``type`` identifiers."""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["PROBLEMS", "Problem", "render_problem"]


@dataclass(frozen=True, slots=True)
class Problem:
    """One kind of error answer.

    Attributes:
        slug: the stable last part of the problem ``type``.
        status: the HTTP status.
        title: a short, fixed summary.
    """

    slug: str
    status: int
    title: str


PROBLEMS: dict[str, Problem] = {
    p.slug: p
    for p in (
        Problem("idempotency-key-missing", 400, "Idempotency-Key is missing"),
        Problem("idempotency-key-invalid", 400, "Idempotency-Key is malformed"),
        Problem("idempotency-key-reused", 422, "Idempotency-Key is already used"),
        Problem(
            "idempotency-request-in-progress",
            409,
            "A request is outstanding for this Idempotency-Key",
        ),
        Problem("idempotency-request-too-large", 413, "Request body is too large"),
        Problem("idempotency-store-unavailable", 503, "Idempotency store is unavailable"),
        Problem(
            "idempotency-outcome-unknown",
            409,
            "The outcome of the first request with this Idempotency-Key is unknown",
        ),
        # retrysafe proxy
        Problem("upstream-unreachable", 502, "The upstream cannot be reached"),
        Problem("upstream-no-answer", 502, "The upstream gave no answer"),
        Problem("upstream-timeout", 504, "The upstream did not answer in time"),
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
    problem = PROBLEMS[slug]
    body = json.dumps(
        {
            "type": type_base + slug,
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
