"""The bounded body readers the shells share (``retrysafe._body``): a body they refuse carries
the flow's answer, ``413`` or the one for a client that left."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest

from retrysafe import IdempotencyConfig
from retrysafe._body import BLOCK, BodyRefused, read_asgi_body, read_wsgi_body


class Stream(io.BytesIO):
    """A ``wsgi.input`` that fails (``OSError``) at its end when asked to, as uWSGI's and
    mod_wsgi's do when the connection breaks."""

    def __init__(self, data: bytes, *, fail: bool = False) -> None:
        super().__init__(data)
        self.fail = fail

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        if not chunk and self.fail:
            raise OSError("connection reset")
        return chunk


def environ(stream: io.BytesIO, **extra: Any) -> dict[str, Any]:
    return {"wsgi.input": stream, **extra}


def config(limit: int = 1000) -> IdempotencyConfig:
    return IdempotencyConfig(max_body_size=limit)


def refused(error: pytest.ExceptionInfo[BodyRefused]) -> tuple[int, str | None]:
    return error.value.answer.status, error.value.answer.event


def test_a_declared_length_is_read_exactly_even_when_more_follows() -> None:
    stream = Stream(b"0123456789tail")
    assert read_wsgi_body(environ(stream), 10, config()) == b"0123456789"
    assert stream.read() == b"tail"


def test_a_body_longer_than_a_block_is_read_whole() -> None:
    data = bytes(range(256)) * (3 * BLOCK // 256 + 1)
    assert read_wsgi_body(environ(Stream(data)), len(data), config(len(data))) == data


@pytest.mark.parametrize("fail", [False, True], ids=["stream-ends", "stream-fails"])
def test_a_stream_that_ends_short_of_its_length_is_the_client_gone(fail: bool) -> None:
    with pytest.raises(BodyRefused) as error:
        read_wsgi_body(environ(Stream(b"short", fail=fail)), 10, config())
    assert refused(error) == (400, "client_gone")
    assert error.value.answer.body == b""


@pytest.mark.parametrize(
    "extra",
    [{"HTTP_TRANSFER_ENCODING": "chunked"}, {"wsgi.input_terminated": True}],
    ids=["chunked", "input-terminated"],
)
def test_a_body_without_length_is_read_to_the_end_of_the_stream(extra: dict[str, Any]) -> None:
    assert read_wsgi_body(environ(Stream(b"x" * 100), **extra), -1, config()) == b"x" * 100


def test_a_body_without_length_is_refused_once_over_the_limit_and_read_no_further() -> None:
    stream = Stream(b"x" * (4 * BLOCK))
    with pytest.raises(BodyRefused) as error:
        read_wsgi_body(environ(stream, HTTP_TRANSFER_ENCODING="chunked"), -1, config(BLOCK + 1))
    assert refused(error) == (413, "too_large")
    assert len(stream.read()) == 2 * BLOCK  # the rest was never read


def test_a_chunked_stream_that_fails_is_the_client_gone() -> None:
    stream = Stream(b"part", fail=True)
    with pytest.raises(BodyRefused) as error:
        read_wsgi_body(environ(stream, HTTP_TRANSFER_ENCODING="chunked"), -1, config())
    assert refused(error) == (400, "client_gone")


def test_no_length_and_no_framing_is_no_body() -> None:
    # PEP 3333: without Content-Length the app must not read to the end of a kept-alive stream.
    assert read_wsgi_body(environ(Stream(b"next request")), -1, config()) == b""


def _receive(messages: list[dict[str, Any]]) -> Any:
    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    return receive


def test_asgi_body_of_several_messages_is_joined() -> None:
    first = {"type": "http.request", "body": b"ab", "more_body": True}
    rest = [
        {"type": "http.request", "body": b"", "more_body": True},
        {"type": "http.request", "body": b"cd", "more_body": False},
    ]
    assert asyncio.run(read_asgi_body(first, _receive(rest), config())) == b"abcd"


def test_asgi_disconnect_before_the_last_message_is_the_client_gone() -> None:
    first = {"type": "http.request", "body": b"ab", "more_body": True}
    with pytest.raises(BodyRefused) as error:
        asyncio.run(read_asgi_body(first, _receive([{"type": "http.disconnect"}]), config()))
    assert refused(error) == (400, "client_gone")


def test_asgi_body_is_refused_once_over_the_limit_and_received_no_further() -> None:
    first = {"type": "http.request", "body": b"x" * 6, "more_body": True}
    rest = [{"type": "http.request", "body": b"never read", "more_body": False}]
    with pytest.raises(BodyRefused) as error:
        asyncio.run(read_asgi_body(first, _receive(rest), config(5)))
    assert refused(error) == (413, "too_large")
    assert len(rest) == 1
