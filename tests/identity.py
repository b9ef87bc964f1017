"""Two requests and whether an application tells them apart: the model behind the identity
property tests (tests/contract/test_identity_properties.py on every shell, and
tests/proxy/test_identity_properties.py through the sidecar to a real upstream).

A :class:`Shape` is what a client controls: path segments, query pairs in order, a credential
and a body. :func:`pairs` draws a first request and a second one made from it by one change,
with whether the application treats the two as the same request: names of the query in
another order are the same (every framework reads a query as values per name), and so are other
spellings of one path (RFC 3986 6.2.2: an unreserved character escaped, hex digits in another
case, an invalid escape against its ``%25`` spelling); every other change (another order of one
name's values, another value, path, credential, case of a credential, body, a path byte that is
not UTF-8, or a reserved character against its escape where the app receives the raw path) is
another request.
"""

from __future__ import annotations

import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from urllib.parse import urlencode

from hypothesis import strategies as st

__all__ = ["Send", "Shape", "check_pair", "pairs"]

#: Sends one request under a key: ``(status, replayed, body)``.
Send = Callable[["Shape", str], tuple[int, bool, bytes]]

_SEGMENT = st.text(string.ascii_letters + string.digits + "-._~", min_size=1, max_size=8)
#: Names no test app reads as a knob (status, hold, sleep, fail, size, h, mark, delay_ms...).
_NAME = st.sampled_from(["a", "b", "item", "x", "zz"])
_VALUE = st.text(string.ascii_letters + string.digits + " -_.&=/", max_size=6)
_TOKEN = st.text(string.ascii_letters + string.digits + "-_", min_size=1, max_size=12)
#: Reserved characters a path segment may hold as they are (RFC 3986 ``pchar``), and ``/``.
_RESERVED = "/:@!$&'()*+,;="
#: Bytes whose escape stays an escape in the normal form and has a hex letter: reserved
#: characters, and bytes past ASCII as UTF-8 sequences (the Werkzeug and Django ASGI shells
#: decode a path as UTF-8).
_KEPT = st.sampled_from(
    [bytes([b]) for b in _RESERVED.encode() if not f"{b:02X}".isdigit()]
    + [b"\xc3\xa9", b"\xe2\x82\xac", b"\xf0\x9f\x98\x80"]
)


@dataclass(frozen=True)
class Shape:
    """One request as a client sends it (always ``POST``)."""

    segments: tuple[str, ...]
    query: tuple[tuple[str, str], ...]
    token: str | None
    bare: bool
    body: bytes

    @property
    def target(self) -> str:
        """Path and query, percent-encoded as sent (a segment may carry its own escapes)."""
        path = "/orders/p/" + "/".join(self.segments)
        return path + ("?" + urlencode(self.query) if self.query else "")

    @property
    def headers(self) -> dict[str, str]:
        """The request's headers but its key: the credential."""
        if self.token is None:
            return {}
        return {"Authorization": self.token if self.bare else f"Bearer {self.token}"}


@st.composite
def _shapes(draw: st.DrawFn) -> Shape:
    first = draw(_VALUE)
    second = draw(_VALUE.filter(lambda v: v != first))
    before = draw(st.lists(st.tuples(_NAME, _VALUE), max_size=3))
    between = draw(st.lists(st.tuples(_NAME, _VALUE), max_size=2))
    # One name always has two different values, so their order can change.
    query = (*before, ("qty", first), *between, ("qty", second))
    return Shape(
        segments=tuple(draw(st.lists(_SEGMENT, min_size=1, max_size=3))),
        query=query,
        token=draw(st.none() | _TOKEN),
        bare=draw(st.booleans()),
        body=draw(st.binary(max_size=32)),
    )


def _names_reordered(shape: Shape, order: list[str]) -> Shape:
    # A stable sort by a new order of names: each name's values keep their order.
    rank = {name: i for i, name in enumerate(order)}
    return replace(shape, query=tuple(sorted(shape.query, key=lambda pair: rank[pair[0]])))


@st.composite
def pairs(
    draw: st.DrawFn, *, byte_paths: bool = True, raw_paths: bool = False
) -> tuple[Shape, Shape, bool, str]:
    """A first request, a second made from it by one change, whether the application treats
    them as one request, and the change's name.

    Args:
        draw: hypothesis' draw.
        byte_paths: also change a path byte that is not UTF-8 (``%FF`` vs ``%FE``), for the
            fronts whose application receives the bytes.
        raw_paths: also send ``a%2Fb`` against ``a/b``, for the fronts whose application
            receives the raw path (ASGI's ``raw_path``, the proxy's upstream).
    """
    shape = draw(_shapes())
    changes = ["names", "values", "value", "path", "principal", "case", "body"]
    changes += ["byte"] if byte_paths else []
    changes += ["slash", "reserved"] if raw_paths else []
    changes += ["unreserved", "hexcase", "invalid"]
    change = draw(st.sampled_from(changes))
    if change == "names":
        names = sorted({name for name, _ in shape.query})
        return shape, _names_reordered(shape, draw(st.permutations(names))), True, change
    if change == "values":  # the values of "qty" in the other order
        swapped = tuple(reversed([v for n, v in shape.query if n == "qty"]))
        it = iter(swapped)
        query = tuple((n, next(it)) if n == "qty" else (n, v) for n, v in shape.query)
        return shape, replace(shape, query=query), False, change
    if change == "value":
        i = draw(st.integers(0, len(shape.query) - 1))
        name, value = shape.query[i]
        other = draw(_VALUE.filter(lambda v: v != value))
        query = (*shape.query[:i], (name, other), *shape.query[i + 1 :])
        return shape, replace(shape, query=query), False, change
    if change == "path":
        i = draw(st.integers(0, len(shape.segments) - 1))
        other = draw(_SEGMENT.filter(lambda s: s != shape.segments[i]))
        segments = (*shape.segments[:i], other, *shape.segments[i + 1 :])
        return shape, replace(shape, segments=segments), False, change
    if change == "principal":
        other_token = draw(_TOKEN.filter(lambda t: t != shape.token))
        return shape, replace(shape, token=other_token), False, change
    if change == "case":  # a credential whose case differs is another credential
        token = draw(_TOKEN.filter(lambda t: t.swapcase() != t))
        return replace(shape, token=token), replace(shape, token=token.swapcase()), False, change
    if change == "body":
        body = draw(st.binary(max_size=32).filter(lambda b: b != shape.body))
        return shape, replace(shape, body=body), False, change
    if change == "slash":
        left, right = draw(_SEGMENT), draw(_SEGMENT)
        first = replace(shape, segments=(*shape.segments, f"{left}%2F{right}"))
        return first, replace(shape, segments=(*shape.segments, left, right)), False, change
    if change == "reserved":  # a reserved character against its escape: two paths
        left, right = draw(_SEGMENT), draw(_SEGMENT)
        char = draw(st.sampled_from(_RESERVED))
        escape = _escape(draw, ord(char))
        first = replace(shape, segments=(*shape.segments, f"{left}{escape}{right}"))
        return (
            first,
            replace(shape, segments=(*shape.segments, f"{left}{char}{right}")),
            False,
            change,
        )
    if change == "unreserved":  # some unreserved characters escaped: one path
        i = draw(st.integers(0, len(shape.segments) - 1))
        segment = shape.segments[i]
        escaped = draw(st.lists(st.booleans(), min_size=len(segment), max_size=len(segment)))
        if not any(escaped):
            escaped[draw(st.integers(0, len(segment) - 1))] = True
        spelled = "".join(
            _escape(draw, ord(c)) if e else c for c, e in zip(segment, escaped, strict=True)
        )
        segments = (*shape.segments[:i], spelled, *shape.segments[i + 1 :])
        return shape, replace(shape, segments=segments), True, change
    if change == "hexcase":  # the hex digits of escapes in another case: one path
        digits = "".join(f"%{b:02X}" for b in draw(_KEPT))
        first = replace(shape, segments=(*shape.segments, f"x{digits}"))
        second = replace(shape, segments=(*shape.segments, f"x{_case(draw, digits)}"))
        return first, second, True, change
    if change == "invalid":  # a "%" that begins no escape is a percent sign: "%25"
        tail = draw(st.sampled_from(["", "g", "zz", "4", "4g", "%"]))
        segment = draw(_SEGMENT)
        first = replace(shape, segments=(*shape.segments, f"{segment}%{tail}"))
        second = replace(
            shape, segments=(*shape.segments, f"{segment}%25{tail.replace('%', '%25')}")
        )
        return first, second, True, change
    byte, other_byte = draw(st.lists(st.integers(0x80, 0xFF), min_size=2, max_size=2, unique=True))
    first = replace(shape, segments=(*shape.segments, f"x%{byte:02X}"))
    return first, replace(shape, segments=(*shape.segments, f"x%{other_byte:02X}")), False, change


def _case(draw: st.DrawFn, digits: str) -> str:
    # The same escapes with some of their hex letters in another case (at least one).
    flips = draw(st.lists(st.booleans(), min_size=len(digits), max_size=len(digits)))
    spelled = "".join(c.swapcase() if f else c for c, f in zip(digits, flips, strict=True))
    return spelled if spelled != digits else digits.lower()


def _escape(draw: st.DrawFn, byte: int) -> str:
    # An escape with its hex digits in either case.
    return draw(st.sampled_from([f"%{byte:02X}", f"%{byte:02x}"]))


def check_pair(send: Send, case: tuple[Shape, Shape, bool, str]) -> None:
    """Send the two requests of ``case`` under one new key: the second is a replay of the first
    exactly when the application treats them as one request (else it runs, or is a ``422``)."""
    first, second, same, change = case
    key = str(uuid.uuid4())
    status, replayed, body = send(first, key)
    assert (status, replayed) == (201, False), (first, status)
    status, replayed, again = send(second, key)
    if same:
        assert replayed and again == body, (change, first.target, second.target)
    else:
        assert not replayed, (change, first, second)
        assert status in (201, 422), (change, status)
