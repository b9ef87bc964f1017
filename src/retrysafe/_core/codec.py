"""StoredResponse <-> bytes.

A versioned, explicit binary layout; never pickle (a store is shared data, and unpickling shared
data executes code)::

    b"RS" | version (1 byte) | flags (1 byte) | status (2 bytes, big endian)
    | header count (2 bytes) | per header: name length (2) name, value length (4) value
    | body length (8 bytes) | body

The body length makes a truncated record detectable (a body cut short would otherwise be
replayed as if complete); version 1 had none.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TypeAlias

from .errors import CodecError

__all__ = ["RawHeaders", "StoredResponse", "decode", "decode_response", "encode", "encode_response"]

#: Response headers as a shell hands them over: a list of pairs or a tuple of them.
RawHeaders: TypeAlias = list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...]

_MAGIC = b"RS"
_VERSION = 2
_FLAG_BODY_OMITTED = 0x01
_HEAD = struct.Struct(">2sBBHH")
_NAME = struct.Struct(">H")
_VALUE = struct.Struct(">I")
_BODY = struct.Struct(">Q")


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A response as it is kept for replay.

    Attributes:
        status: the HTTP status code.
        headers: raw header pairs, lower-case names, in the order they were sent.
        body: the full body (empty when ``body_omitted``).
        body_omitted: the body was larger than the storable limit and was not kept.
    """

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    body_omitted: bool = False


def encode_response(response: StoredResponse) -> bytes:
    """Serialize a response for a store.

    Args:
        response: the response to keep.

    Returns:
        The bytes to store.
    """
    return encode(
        response.status, response.headers, response.body, response.body_omitted, lower=False
    )


def encode(
    status: int,
    headers: RawHeaders,
    body: bytes,
    body_omitted: bool = False,
    *,
    deny: frozenset[bytes] = frozenset(),
    allow: frozenset[bytes] | None = None,
    added: RawHeaders = (),
    lower: bool = True,
) -> bytes:
    """:func:`encode_response` from the parts (the hot path: no :class:`StoredResponse`), in
    one pass that also lower-cases the names (unless ``lower`` is false) and leaves out those
    in ``deny`` (or not in ``allow``), then appends ``added`` as given.
    """
    parts = [b""]  # the head, once the count is known
    count = 0
    name_len = _NAME.pack
    value_len = _VALUE.pack
    for name, value in headers:
        if lower:
            name = name.lower()
        if name in deny or (allow is not None and name not in allow):
            continue
        parts += (name_len(len(name)), name, value_len(len(value)), value)
        count += 1
    for name, value in added:
        parts += (name_len(len(name)), name, value_len(len(value)), value)
        count += 1
    flags = _FLAG_BODY_OMITTED if body_omitted else 0
    parts[0] = _HEAD.pack(_MAGIC, _VERSION, flags, status, count)
    parts += (_BODY.pack(len(body)), body)
    return b"".join(parts)


def decode_response(data: bytes) -> StoredResponse:
    """Parse bytes written by :func:`encode_response`.

    Args:
        data: the stored bytes.

    Returns:
        The response.

    Raises:
        CodecError: the bytes are truncated, corrupt or of an unknown version.
    """
    status, headers, body, omitted = decode(data)
    return StoredResponse(status, tuple(headers), body, omitted)


def decode(data: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool]:
    """:func:`decode_response` as parts: status, a fresh header list, body, body omitted (the
    replay path: no :class:`StoredResponse`, a list the caller may extend)."""
    if type(data) is not bytes:
        data = bytes(data)
    try:
        magic, version, flags, status, count = _HEAD.unpack_from(data, 0)
        if magic != _MAGIC or version != _VERSION:
            raise CodecError(f"unknown stored-response format (version {version})")
        offset = 8  # _HEAD.size
        headers = []
        name_at = _NAME.unpack_from
        value_at = _VALUE.unpack_from
        for _ in range(count):
            end = offset + 2 + name_at(data, offset)[0]
            name = data[offset + 2 : end]
            offset = end + 4 + value_at(data, end)[0]
            headers.append((name, data[end + 4 : offset]))
        if offset > len(data):  # a slice above ran past the end: the record is cut short
            raise CodecError("stored response is truncated")
        body_len = _BODY.unpack_from(data, offset)[0]
        offset += 8  # _BODY.size
    except struct.error as exc:
        raise CodecError("stored response is truncated") from exc
    if len(data) - offset != body_len:
        raise CodecError("stored response body is truncated or has trailing bytes")
    if not 100 <= status <= 599:
        raise CodecError(f"stored response has an impossible status {status}")
    return status, headers, data[offset:], bool(flags & _FLAG_BODY_OMITTED)
