"""The neutral request head: what the flow needs to know of a request, on every front.

Each shell builds one in a single pass over its headers (an ASGI scope, a WSGI environ, a
framework request); the flow, and a user's ``scope_resolver``, see only this object, so a
resolver works unchanged on every front.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Request", "content_length"]


class Request:
    """One request as the idempotency flow sees it.

    Attributes:
        method: the upper-case HTTP method.
        path: the request path (no query).
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
    ) -> None:
        self.method = method
        self.path = path
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
