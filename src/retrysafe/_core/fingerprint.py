"""Request fingerprint: what makes two requests with one key "the same request".

Method, path, the query with its parameters sorted by name (the values of one name keep their
order), and the body. By default the raw body bytes
are hashed (about 2 us per KiB). ``canonical_json=True`` hashes a canonical form of a JSON body
instead (sorted keys, no insignificant white space), for clients that re-serialize on retry; it
costs 13-59 us per KiB, so it is opt-in. A body that is not valid JSON falls back to raw bytes.
"""

from __future__ import annotations

import hashlib
import json
from urllib.parse import parse_qsl, urlencode

__all__ = ["fingerprint"]


def _canonical_query(query_string: bytes) -> bytes:
    if not query_string:
        return b""
    # latin-1 maps every byte to one character, so percent escapes that are not UTF-8 (%FF vs
    # %FE) stay distinct instead of both decoding to U+FFFD.
    pairs = parse_qsl(query_string.decode("latin-1"), keep_blank_values=True, encoding="latin-1")
    # Sorted by name only (a stable sort): the order across names means nothing to a framework,
    # but the order of one name's values does (Flask's ``args.get`` reads the first value,
    # Django's ``GET.get`` the last), so ``qty=1&qty=5`` and ``qty=5&qty=1`` stay distinct.
    pairs.sort(key=_name)
    return urlencode(pairs, encoding="latin-1").encode("ascii")


def _name(pair: tuple[str, str]) -> str:
    return pair[0]


class _Inexact(ValueError):
    """A JSON number that a float does not hold exactly."""


def _exact_float(text: str) -> float:
    # Two numbers one float holds (0.1 and 0.10000000000000001, 1e400 and 2e400) are two
    # amounts to an app that parses decimals (pydantic's Decimal, parse_float=Decimal): only a
    # number written as its float writes itself is canonical; any other body is hashed raw.
    value = float(text)
    if repr(value) != text:
        raise _Inexact(text)
    return value


def _canonical_json(body: bytes) -> bytes | None:
    try:
        data = json.loads(body, parse_float=_exact_float)
    except (ValueError, RecursionError):  # _Inexact is a ValueError
        return None
    return json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=True
    ).encode("utf-8")


def fingerprint(
    method: str,
    path: str,
    query_string: bytes,
    body: bytes,
    *,
    canonical_json: bool = False,
    content_type: bytes = b"",
) -> str:
    """Return the fingerprint of a request.

    Args:
        method: HTTP method.
        path: request path.
        query_string: raw query string.
        body: the full request body.
        canonical_json: hash a canonical form of a JSON body rather than its raw bytes.
        content_type: the request's Content-Type; canonicalization applies to JSON types only.

    Returns:
        A hex digest.
    """
    head = b"\x00".join(
        (
            method.encode("ascii", "replace"),
            path.encode("utf-8", "surrogateescape"),
            _canonical_query(query_string) if query_string else b"",
            b"",
        )
    )
    if canonical_json and body and b"json" in content_type.lower():
        canonical = _canonical_json(body)
        if canonical is not None:
            return hashlib.sha256(head + b"J" + canonical).hexdigest()
    digest = hashlib.sha256(head)
    digest.update(b"R")
    digest.update(body)
    return digest.hexdigest()
