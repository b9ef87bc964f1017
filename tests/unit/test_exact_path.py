"""The path that identifies a record: every distinction the application can see."""

from __future__ import annotations

from retrysafe._core.request import exact_path, path_as_sent, path_of_bytes
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
