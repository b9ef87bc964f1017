"""Reading a request body within the limit, for every shell (WSGI, Django, ASGI).

A body the readers do not return raises :class:`BodyRefused`, which carries the flow's answer
for it: ``413`` past ``max_body_size`` (:func:`~retrysafe._core.http.too_large`), or, when the
body ended before it was complete, :func:`~retrysafe._core.http.client_gone`. Every shell sends
that answer as it is, so "the client left before sending its body" is decided once: nothing ran
and no key was reserved, and the client's retry runs as if this request had never come. The
ASGI shell reads a body that arrives in one message itself (the common case, no call);
:func:`read_asgi_body` takes over from the second.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from ._core.config import IdempotencyConfig
from ._core.http import Answer, client_gone, too_large

__all__ = ["BLOCK", "BodyRefused", "read_asgi_body", "read_wsgi_body"]

#: How much one read of ``wsgi.input`` asks for.
BLOCK = 64 * 1024


class BodyRefused(Exception):
    """The body is not read: it is too large, or it ended early (the client left).

    Attributes:
        answer: the flow's answer, which the shell sends instead of running anything.
    """

    def __init__(self, answer: Answer) -> None:
        super().__init__(answer.event)
        self.answer = answer


def read_wsgi_body(environ: Mapping[str, Any], length: int, config: IdempotencyConfig) -> bytes:
    """The body of a WSGI request (PEP 3333), read from ``wsgi.input``.

    By ``Content-Length`` when there is one; to the end of the stream when the request is
    chunked or the server says the stream ends at the body (``wsgi.input_terminated``); else
    there is no body.

    Args:
        environ: the request's environ.
        length: the declared ``Content-Length`` (``-1``: none; a declared length is checked
            against the limit before, at admission).
        config: the route's settings (``max_body_size``).

    Raises:
        BodyRefused: ``413`` once the body is over ``max_body_size`` (the rest is never read);
            ``client_gone`` when the stream ended before ``Content-Length`` bytes or failed
            (``OSError``: the connection broke or timed out).
    """
    stream = environ["wsgi.input"]
    chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
    if not chunked and length < 0 and not environ.get("wsgi.input_terminated"):
        return b""  # no length, no chunked framing: PEP 3333 says there is no body
    parts: list[bytes] = []
    try:
        if length >= 0 and not chunked:
            left = length
            while left > 0:
                part = stream.read(min(left, BLOCK))
                if not part:
                    raise BodyRefused(client_gone())
                if len(part) == length and type(part) is bytes:
                    return part  # the whole body in one read (the common case): no join
                parts.append(part)
                left -= len(part)
            return b"".join(parts)
        size = 0
        while part := stream.read(BLOCK):
            size += len(part)
            if size > config.max_body_size:
                raise BodyRefused(too_large(config))
            parts.append(part)
    except OSError as exc:
        raise BodyRefused(client_gone()) from exc
    return b"".join(parts)


async def read_asgi_body(
    message: MutableMapping[str, Any],
    receive: Callable[[], Awaitable[Any]],
    config: IdempotencyConfig,
) -> bytes:
    """The body of an ASGI request that did not come in one message.

    Args:
        message: the first message the server gave.
        receive: the server's receive, for the rest.
        config: the route's settings (``max_body_size``).

    Raises:
        BodyRefused: ``413`` once the body is over ``max_body_size`` (the rest is never
            received); ``client_gone`` when the server reported ``http.disconnect`` first.
    """
    chunks: list[bytes] = []
    size = 0
    while True:
        if message["type"] == "http.disconnect":
            raise BodyRefused(client_gone())
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > config.max_body_size:
                raise BodyRefused(too_large(config))
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        message = await receive()
