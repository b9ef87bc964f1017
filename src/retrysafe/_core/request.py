"""The neutral request head: what the flow needs to know of a request, on every front.

Each shell builds one in a single pass over its headers (an ASGI scope, a WSGI environ, a
framework request); the flow, and a user's ``scope_resolver``, see only this object, so a
resolver works unchanged on every front.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote_from_bytes, unquote_to_bytes

__all__ = [
    "Request",
    "content_length",
    "exact_path",
    "normal_path",
    "path_as_sent",
    "path_of_bytes",
]

#: RFC 3986 reserved characters (gen-delims and sub-delims): an escape of one is another path
#: than the character (``a%2Fb`` is not ``a/b``), so it stays an escape.
_RESERVED = frozenset(":/?#[]@!$&'()*+,;=")
#: Printable ASCII but ``%``: written as itself in a normal path (the reserved characters where
#: the client wrote them so, every other one always).
_PRINTABLE = "".join(chr(b) for b in range(0x21, 0x7F) if b != 0x25)
#: Each escaped byte in a normal path: the character itself for an unreserved one (RFC 3986
#: 6.2.2.2) and for the other printable ASCII characters that are not reserved (``{``, ``|``:
#: no URI may contain them, so no server gives their escape a meaning of its own); ``%XX`` in
#: upper case for a reserved character, ``%``, space, a control and every byte past ASCII.
_ESCAPED = tuple(
    chr(b) if chr(b) in _PRINTABLE and chr(b) not in _RESERVED else f"%{b:02X}" for b in range(256)
)
#: An escape, or a ``%`` that begins none (``%zz``, ``%4``, a final ``%``).
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})?")


def _normal_escape(match: re.Match[str]) -> str:
    digits = match[1]
    # A "%" that begins no escape is a percent sign, as servers decode it (Starlette, Werkzeug
    # and urllib leave it in the path the app sees): the same path as "%25".
    return "%25" if digits is None else _ESCAPED[int(digits, 16)]


class Request:
    """One request as the idempotency flow sees it.

    Attributes:
        method: the upper-case HTTP method.
        path: the request path (no query), decoded.
        exact_path: the path as the record identifies it (it addresses the record and enters
            the fingerprint): every distinction the application can see, written as
            :func:`exact_path` does; ``path`` itself when that is plain ASCII.
        query: the raw query string.
        keys: the values of every ``Idempotency-Key`` header field, in order.
        content_length: the declared body length, ``-1`` when absent or unreadable.
        content_type: the ``Content-Type`` value (``b""`` when absent).
        authorization: the ``Authorization`` value (``b""`` when absent).
        user: the framework's authenticated user object (Starlette ``scope["user"]``, Django
            ``request.user``) or name (WSGI ``REMOTE_USER``), else ``None``.
        headers: every header as ``(lower-case name, value)`` byte pairs (built on first use
            when the shell gives ``find_headers`` instead).
        source: the shell's own request object (ASGI scope, WSGI environ), for ``find_route``.
    """

    __slots__ = (
        "_find_headers",
        "_find_route",
        "_headers",
        "_route",
        "authorization",
        "content_length",
        "content_type",
        "exact_path",
        "keys",
        "method",
        "path",
        "query",
        "source",
        "user",
    )

    def __init__(
        self,
        method: str,
        path: str,
        query: bytes,
        keys: list[bytes],
        content_length: int,
        content_type: bytes,
        authorization: bytes,
        user: Any,
        headers: Sequence[tuple[bytes, bytes]] | None,
        *,
        route: str | None = None,
        source: Any = None,
        find_route: Callable[[Any], str | None] | None = None,
        find_headers: Callable[[Any], Sequence[tuple[bytes, bytes]]] | None = None,
        exact_path: str | None = None,
    ) -> None:
        self.method = method
        self.path = path
        self.exact_path = path if exact_path is None else exact_path
        self.query = query
        self.keys = keys
        self.content_length = content_length
        self.content_type = content_type
        self.authorization = authorization
        self.user = user
        self._headers = headers
        self._find_headers = find_headers
        self.source = source
        self._route = route
        self._find_route = find_route

    @property
    def headers(self) -> Sequence[tuple[bytes, bytes]]:
        """Every header as ``(lower-case name, value)`` byte pairs, in order."""
        if self._headers is None:
            find, self._find_headers = self._find_headers, None
            self._headers = () if find is None else find(self.source)
        return self._headers

    @property
    def route(self) -> str | None:
        """The route template (``/orders/{id}``) when known, else ``None``; found on first use
        (only metrics and logs ask), never the raw path."""
        if self._find_route is not None:
            find, self._find_route = self._find_route, None
            self._route = find(self.source)
        return self._route

    @route.setter
    def route(self, template: str | None) -> None:
        # A shell (or framework integration) that learns the route after building the request.
        self._find_route = None
        self._route = template

    def header(self, name: str) -> str | None:
        """Return the first value of the header ``name`` (case-insensitive), if present."""
        wanted = name.lower().encode("latin-1")
        for key, value in self.headers:
            if key == wanted:
                return value.decode("latin-1")
        return None

    def __repr__(self) -> str:
        return f"<Request {self.method} {self.path}>"


def content_length(value: bytes | str) -> int:
    """The declared body length of a ``Content-Length`` value, ``-1`` when absent or unreadable."""
    try:
        return int(value) if value else -1
    except ValueError:
        return -1


def exact_path(decoded: str, raw: bytes | None = None) -> str:
    """The request path as a record identifies it: every distinction the application can see.

    A path in plain ASCII without ``%`` is itself (the common case; record ids unchanged). Any
    other path is written in :func:`normal_path`'s form, so that two spellings of one path are
    one (``/%6Frders`` is ``/orders``, ``%c3`` is ``%C3``) and two paths stay two: the raw path
    an ASGI server passes (``raw_path``: ``a%2Fb`` is not ``a/b``, and ``%FF`` is not ``%FE``,
    although both decode to U+FFFD), else the UTF-8 bytes of the decoded path. A raw path that
    does not decode to the decoded one (a middleware rewrote ``path``) gives way to the decoded
    path, which the application routes on.

    Args:
        decoded: the decoded path (ASGI ``scope["path"]``).
        raw: the raw path as sent, when the server gives it (ASGI ``scope["raw_path"]``).

    Returns:
        The path that enters the record id and the fingerprint.
    """
    if (
        raw
        and (b"%" in raw or not raw.isascii())
        and unquote_to_bytes(raw).decode("utf-8", "replace") == decoded
    ):
        return normal_path(raw)
    if decoded.isascii() and "%" not in decoded:
        return decoded
    return path_of_bytes(decoded.encode("utf-8", "surrogatepass"))


def normal_path(raw: bytes) -> str:
    """The RFC 3986 (6.2.2) normal form of a path as sent: one spelling per path.

    An escaped unreserved character (ALPHA, DIGIT, ``-._~``) is the character (``/%6Frders`` is
    ``/orders``), and so is an escaped printable character that is not reserved either (``%7B``
    is ``{``); hex digits are upper case (``%c3%a9`` is ``%C3%A9``); an escaped reserved
    character stays an escape (``/a%2Fb`` is not ``/a/b``), as do ``%25``, space, controls and
    every byte past ASCII (``%FF`` is not ``%FE``). A ``%`` that begins no escape (``%zz``, a
    final ``%``) is a percent sign, the same path as ``%25zz``: the path every server hands the
    app for both. A space, control or non-ASCII byte sent unescaped is written escaped.

    Args:
        raw: the path as sent (ASGI ``scope["raw_path"]``), without the query.

    Returns:
        The path that enters the record id and the fingerprint; ``raw`` itself when it is plain
        ASCII without ``%`` (the common case, no work).
    """
    if raw.isascii() and b"%" not in raw:
        return raw.decode("ascii")
    return _ESCAPE.sub(_normal_escape, quote_from_bytes(raw, safe=_PRINTABLE + "%"))


def path_as_sent(path: str) -> str:
    """The record's path of a path written as a client sends it (``/caf%C3%A9``, ``/a%2Fb``;
    ``/café`` is taken as its UTF-8 bytes): what ``retrysafe inspect --path`` looks up."""
    return normal_path(path.encode("utf-8", "surrogatepass"))


def path_of_bytes(data: bytes) -> str:
    """A decoded path given as its bytes (a WSGI ``PATH_INFO``), as :func:`exact_path` writes it:
    itself when plain ASCII without ``%``, else in :func:`normal_path`'s form (``/caf%C3%A9``,
    as on ASGI; a ``%`` in it is a percent sign, ``%25``)."""
    if data.isascii() and b"%" not in data:
        return data.decode("ascii")
    return normal_path(data.replace(b"%", b"%25"))
