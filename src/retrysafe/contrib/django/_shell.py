"""Plain helpers of the Django shell: Django's request and response to the flow's neutral values
and back. Nothing here talks to a store; the steps that do are :mod:`._async_view` and its
generated twin :mod:`._sync_view`.

Two helpers come as a hand-written pair, because the two modes genuinely differ: the user
(``request.user`` vs ``await request.auser()``) and the capture of a streamed response (sync
iteration vs async iteration, replayed to Django's ASGI handler as an async iterator).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import AsyncIterator
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, HttpResponseBase, UnreadablePostError
from django.http.request import RawPostDataException

from ..._body import BodyRefused, read_wsgi_body
from ..._core.config import IdempotencyConfig
from ..._core.http import Answer, Capture, client_gone, too_large
from ..._core.request import Request, exact_path
from ...wsgi import request_from_environ

__all__ = [
    "EXCHANGE_ATTR",
    "Admitted",
    "acapture_response",
    "arequest_user",
    "capture_response",
    "neutral_request",
    "read_body",
    "request_user",
    "response_head",
    "to_response",
    "with_added",
]

#: Where ``process_view`` leaves the request's exchange for ``__call__`` (and for the view's
#: ``mark_committed``).
EXCHANGE_ATTR = "_retrysafe_exchange"

#: An admitted keyed request: its settings, the neutral request, the parsed key, the body.
Admitted = tuple[IdempotencyConfig, Request, str, bytes]


def neutral_request(request: HttpRequest) -> Request:
    """The neutral request of a Django request (its route template when the URL resolver
    matched a ``path()`` route)."""
    neutral = request_from_environ(request.META)
    # With SCRIPT_NAME: the path the client used, as Django decoded it (bytes that are not UTF-8
    # percent-encoded again), written as every front writes a path that is not plain ASCII.
    neutral.path = request.path
    neutral.exact_path = exact_path(request.path)
    route = getattr(request.resolver_match, "route", None)
    if route:
        neutral.route = "/" + route.lstrip("/")
    return neutral


def read_body(request: HttpRequest, declared: int, config: IdempotencyConfig) -> bytes | Answer:
    """The body within the limit, else the flow's answer: ``413`` past the limit,
    :func:`~retrysafe._core.http.client_gone` when it ended early (the stream failed, or gave
    fewer than ``declared`` bytes: the declared ``Content-Length``, ``-1`` for none), as the
    shared readers of :mod:`retrysafe._body` decide on the other shells."""
    meta = request.META
    if (
        meta.get("wsgi.input_terminated")
        and "chunked" in meta.get("HTTP_TRANSFER_ENCODING", "").lower()
        and not hasattr(request, "_body")
    ):
        # Django reads a WSGI body by its Content-Length only, so it would see a chunked one
        # (de-chunked by the server) as empty, and two different bodies would share one
        # fingerprint. Read it here with the WSGI shell's reader, and hand it to Django the way
        # its own HttpRequest.body keeps a body it has read.
        try:
            body = read_wsgi_body(meta, -1, config)
        except BodyRefused as refused:
            return refused.answer
        request._body = body
        request._stream = io.BytesIO(body)
        return body
    try:
        body = request.body
    except RequestDataTooBig:
        return too_large(config)
    except (UnreadablePostError, OSError):  # the server's stream failed: the client left
        return client_gone()
    except RawPostDataException:
        # A middleware before this one parsed a multipart body from the stream (e.g. CSRF
        # reading request.POST): the raw bytes are gone, so fingerprint what was parsed.
        body = parsed_form(request)
    else:
        if len(body) < declared:
            # Django reads a WSGI body by its Content-Length and takes what the stream gives: a
            # shorter body means the stream ended early (the client left), as on the WSGI shell.
            return client_gone()
    return too_large(config) if len(body) > config.max_body_size else body


def parsed_form(request: HttpRequest) -> bytes:
    """A canonical encoding of a parsed form (fields, then files by name, size and SHA-256):
    equal for equal submissions, different when a field or a file differs."""
    parts: list[bytes] = []
    for name in sorted(request.POST):
        for value in request.POST.getlist(name):
            parts.append(f"field\0{name}\0{value}".encode())
    for name in sorted(request.FILES):
        for upload in request.FILES.getlist(name):
            digest = hashlib.sha256()
            for chunk in upload.chunks():
                digest.update(chunk)
            upload.seek(0)  # the view reads it again
            parts.append(f"file\0{name}\0{upload.name}\0{upload.size}\0".encode())
            parts.append(digest.hexdigest().encode())
    return b"\n".join(parts)


def to_response(answer: Answer) -> HttpResponse:
    """The flow's answer as a Django response (its own headers only)."""
    response = HttpResponse(answer.body, status=answer.status)
    del response["Content-Type"]
    for raw_name, raw_value in answer.headers:
        name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
        response[name] = f"{response[name]}, {value}" if name in response else value
    return response


def with_added(response: Any, exchange: Any) -> Any:
    """The view's response with the headers the flow adds to it (e.g. the retention header)."""
    for name, value in exchange.flow.added_headers:
        response[name.decode("latin-1")] = value.decode("latin-1")
    return response


def response_head(response: HttpResponseBase) -> tuple[int, list[tuple[bytes, bytes]]]:
    """The status and the ``(lower-case name, value)`` header pairs of the view's response."""
    headers = [
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in response.items()
    ]
    return response.status_code, headers


def request_user(request: HttpRequest) -> Any:
    """The request's user (``AuthenticationMiddleware`` sets it), for the default principal."""
    return getattr(request, "user", None)


async def arequest_user(request: HttpRequest) -> Any:
    """The async twin of :func:`request_user`: ``request.auser()``, since the lazy
    ``request.user`` would query the session and the user from the event loop."""
    auser = getattr(request, "auser", None)
    return await auser() if auser is not None else None


def capture_response(response: Any, capture: Capture) -> None:
    """Capture the view's whole body. A streamed one is read to its end first, so the stored
    response is whole and settled before any byte leaves (like the other shells' last chunk)."""
    if response.streaming:
        chunks = [bytes(chunk) for chunk in response]
        response.streaming_content = chunks
    else:
        chunks = [response.content]
    for chunk in chunks:
        capture.add(chunk)


async def acapture_response(response: Any, capture: Capture) -> None:
    """The async twin of :func:`capture_response` (an async streamed body is read with
    ``async for``)."""
    if response.streaming:
        if response.is_async:
            chunks = [bytes(chunk) async for chunk in response.streaming_content]
        else:
            chunks = [bytes(chunk) for chunk in response]
        # An async iterator: Django's ASGI handler warns about consuming a sync one.
        response.streaming_content = _replay(chunks)
    else:
        chunks = [response.content]
    for chunk in chunks:
        capture.add(chunk)


async def _replay(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk
