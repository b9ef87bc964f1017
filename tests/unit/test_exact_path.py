"""The path that identifies a record: every distinction the application can see."""

from __future__ import annotations

import pytest

from retrysafe._core.request import exact_path, normal_path, path_as_sent, path_of_bytes
from retrysafe.wsgi import request_from_environ


def test_a_plain_path_is_itself() -> None:
    assert exact_path("/orders/1", b"/orders/1") == "/orders/1"
    assert path_of_bytes(b"/orders/1") == "/orders/1"


def test_raw_paths_that_decode_alike_stay_distinct() -> None:
    assert exact_path("/a/b", b"/a%2Fb") == "/a%2Fb" != exact_path("/a/b", b"/a/b")
    assert exact_path("/x\ufffd", b"/x%FF") != exact_path("/x\ufffd", b"/x%FE")


def test_a_rewritten_path_gives_way_to_the_decoded_one() -> None:
    # A middleware changed scope["path"] and left raw_path: the app routes on the new path.
    assert exact_path("/v2/orders", b"/v1/orders%2F") == "/v2/orders"


def test_non_ascii_paths_are_written_alike_on_asgi_and_wsgi() -> None:
    asgi = exact_path("/caf\u00e9", b"/caf%C3%A9")
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/caf\u00c3\u00a9"}  # latin-1 text of UTF-8
    wsgi = request_from_environ(environ)
    assert asgi == wsgi.exact_path == "/caf%C3%A9"
    assert wsgi.path == "/caf\u00e9"  # what scope resolvers and logs see is decoded


def test_wsgi_bytes_that_are_not_utf8_stay_distinct() -> None:
    ff = request_from_environ({"PATH_INFO": "/x\u00ff"})
    fe = request_from_environ({"PATH_INFO": "/x\u00fe"})
    assert ff.path == fe.path == "/x\ufffd"
    assert ff.exact_path != fe.exact_path


def test_a_literal_percent_never_meets_an_escape() -> None:
    # /x%25FF (a literal "%FF") and /x%FF (the byte 0xFF) are two paths on every front.
    assert path_of_bytes(b"/x%FF") != path_of_bytes(b"/x\xff")
    assert exact_path("/x%FF", b"/x%25FF") != exact_path("/x\ufffd", b"/x%FF")


def test_the_operator_tools_find_a_path_as_the_client_sent_it() -> None:
    sent = exact_path("/caf\u00e9", b"/caf%C3%A9")
    assert path_as_sent("/caf%C3%A9") == path_as_sent("/caf\u00e9") == sent
    assert path_as_sent("/a%2Fb") == exact_path("/a/b", b"/a%2Fb")
    assert path_as_sent("/orders") == "/orders"


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (b"/%6Frders", b"/orders"),  # an escaped unreserved character is the character
        (b"/%41%7a%30-%2D%2e%5F%7e", b"/Az0--._~"),
        (b"/caf%c3%a9", b"/caf%C3%A9"),  # hex digits in either case
        (b"/a%2fb", b"/a%2Fb"),
        (b"/caf\xc3\xa9", b"/caf%C3%A9"),  # a byte past ASCII sent unescaped
        (b"/x%zz", b"/x%25zz"),  # a "%" that begins no escape is a percent sign
        (b"/x%4", b"/x%254"),
        (b"/x%", b"/x%25"),
        (b"/%7B%7c%7D", b"/{|}"),  # not reserved, not allowed in a URI: as a server decodes it
    ],
)
def test_spellings_of_one_path_have_one_normal_form(one: bytes, other: bytes) -> None:
    assert normal_path(one) == normal_path(other)


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (b"/a%2Fb", b"/a/b"),  # an escaped reserved character is not the character
        (b"/a%3Bb", b"/a;b"),
        (b"/a%40b", b"/a@b"),
        (b"/x%FF", b"/x%FE"),
        (b"/x%2541", b"/x%41"),  # a literal "%41" is not "A"
        (b"/a%20b", b"/a+b"),
    ],
)
def test_other_paths_keep_other_normal_forms(one: bytes, other: bytes) -> None:
    assert normal_path(one) != normal_path(other)


def test_a_plain_path_is_its_own_normal_form() -> None:
    assert normal_path(b"/orders/1") == "/orders/1"
    assert normal_path(b"/%6Frders/%c3%a9") == "/orders/%C3%A9"
