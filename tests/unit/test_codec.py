"""StoredResponse <-> bytes: round trip, and corrupt input is always a CodecError."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrysafe import CodecError, StoredResponse
from retrysafe._core.codec import decode_response, encode_response

headers_st = st.lists(
    st.tuples(st.binary(min_size=1, max_size=40), st.binary(max_size=200)), max_size=12
).map(tuple)
responses = st.builds(
    StoredResponse,
    status=st.integers(100, 599),
    headers=headers_st,
    body=st.binary(max_size=4096),
    body_omitted=st.booleans(),
)

SAMPLE = StoredResponse(
    201,
    ((b"content-type", b"application/json"), (b"location", b"/orders/1")),
    b'{"id": 1}',
)


@given(responses)
def test_round_trip_keeps_status_headers_body_and_omitted_flag(response: StoredResponse) -> None:
    assert decode_response(encode_response(response)) == response


def test_encoding_is_not_pickle() -> None:
    assert encode_response(SAMPLE)[:2] == b"RS"
    assert b"\x80\x04" not in encode_response(SAMPLE)[:4]


@given(responses, st.data())
def test_every_truncation_is_a_codec_error(response: StoredResponse, data: st.DataObject) -> None:
    encoded = encode_response(response)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(CodecError):
        decode_response(encoded[:cut])


def test_truncated_body_is_detected() -> None:
    encoded = encode_response(SAMPLE)
    with pytest.raises(CodecError):
        decode_response(encoded[:-1])


def test_trailing_bytes_are_detected() -> None:
    with pytest.raises(CodecError):
        decode_response(encode_response(SAMPLE) + b"x")


@given(st.binary(max_size=512))
def test_arbitrary_bytes_decode_or_raise_codec_error_only(data: bytes) -> None:
    try:
        decoded = decode_response(data)
    except CodecError:
        return
    assert isinstance(decoded, StoredResponse)


@given(responses, st.data())
def test_flipped_bytes_decode_or_raise_codec_error_only(
    response: StoredResponse, data: st.DataObject
) -> None:
    encoded = bytearray(encode_response(response))
    index = data.draw(st.integers(0, len(encoded) - 1))
    encoded[index] ^= data.draw(st.integers(1, 255))
    with contextlib.suppress(CodecError):
        decode_response(bytes(encoded))


@pytest.mark.parametrize("version", [0, 99, 255])
def test_unknown_version_is_a_codec_error_naming_it(version: int) -> None:
    encoded = bytearray(encode_response(SAMPLE))
    encoded[2] = version
    with pytest.raises(CodecError, match=str(version)):
        decode_response(bytes(encoded))


@pytest.mark.parametrize("data", [b"", b"R", b"XX" + encode_response(SAMPLE)[2:], b"\x80\x04K."])
def test_wrong_magic_or_too_short_is_a_codec_error(data: bytes) -> None:
    with pytest.raises(CodecError):
        decode_response(data)


def test_header_length_pointing_past_the_end_is_a_codec_error() -> None:
    head = struct.pack(">2sBBHH", b"RS", encode_response(SAMPLE)[2], 0, 200, 1)
    with pytest.raises(CodecError):
        decode_response(head + struct.pack(">H", 50) + b"short")


@pytest.mark.parametrize("status", [0, 99, 600, 65535])
def test_implausible_status_is_a_codec_error(status: int) -> None:
    encoded = bytearray(encode_response(SAMPLE))
    encoded[4:6] = struct.pack(">H", status)
    with pytest.raises(CodecError):
        decode_response(bytes(encoded))
