"""The neutral request head: what the flow needs to know of a request, on every front.

Each shell builds one in a single pass over its headers (an ASGI scope, a WSGI environ, a
framework request); the flow, and a user's ``scope_resolver``, see only this object, so a
resolver works unchanged on every front.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote_from_bytes, unquote_to_bytes

__all__ = ["Request", "content_length", "exact_path", "path_as_sent", "path_of_bytes"]

#: RFC 3986 ``pchar`` and ``/``, minus ``%``: what :func:`exact_path` leaves as it is.
_PATH_SAFE = "/!$&'()*+,;=:@"


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
    other path is written percent-encoded, so that two paths stay two: the raw path an ASGI
    server passes (``raw_path``: ``a%2Fb`` is not ``a/b``, and ``%FF`` is not ``%FE``, although
    both decode to U+FFFD), else the UTF-8 bytes of the decoded path, percent-encoded. A raw
    path that does not decode to the decoded one (a middleware rewrote ``path``) gives way to
    the decoded path, which the application routes on.

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
        return raw.decode("latin-1")  # one character per byte: distinct raw paths stay so
    if decoded.isascii() and "%" not in decoded:
        return decoded
    return path_of_bytes(decoded.encode("utf-8", "surrogatepass"))


def path_as_sent(path: str) -> str:
    """The record's path of a path written as a client sends it (``/caf%C3%A9``, ``/a%2Fb``;
    ``/café`` is taken as its UTF-8 bytes): what ``retrysafe inspect --path`` looks up."""
    if path.isascii() and "%" not in path:
        return path
    raw = quote_from_bytes(path.encode("utf-8", "surrogatepass"), safe=_PATH_SAFE + "%")
    return exact_path(unquote_to_bytes(raw).decode("utf-8", "replace"), raw.encode("ascii"))


def path_of_bytes(data: bytes) -> str:
    """A decoded path given as its bytes (a WSGI ``PATH_INFO``), as :func:`exact_path` writes it:
    itself when plain ASCII without ``%``, else percent-encoded (``/caf%C3%A9``, as on ASGI)."""
    if data.isascii() and b"%" not in data:
        return data.decode("ascii")
    return quote_from_bytes(data, safe=_PATH_SAFE)
