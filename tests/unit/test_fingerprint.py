"""Request fingerprints: what makes two requests with one key the same request."""

from __future__ import annotations

import pytest

from retrysafe._core.fingerprint import fingerprint

JSON = b"application/json"


def fp(
    body: bytes = b'{"a": 1}',
    *,
    method: str = "POST",
    path: str = "/orders",
    query: bytes = b"",
    canonical_json: bool = False,
    content_type: bytes = JSON,
) -> str:
    return fingerprint(
        method, path, query, body, canonical_json=canonical_json, content_type=content_type
    )


def test_same_request_gives_the_same_fingerprint() -> None:
    assert fp() == fp()


def test_method_and_path_are_part_of_the_fingerprint() -> None:
    assert fp(method="PATCH") != fp()
    assert fp(path="/payments") != fp()


def test_query_parameter_order_does_not_matter() -> None:
    assert fp(query=b"a=1&b=2") == fp(query=b"b=2&a=1")
    assert fp(query=b"a=%20") == fp(query=b"a=+")


def test_values_of_one_name_keep_their_order() -> None:
    # Frameworks read the first (Flask's args.get) or the last (Django's GET.get) of repeated
    # values, so their order is part of the request; the order across names is not.
    assert fp(query=b"qty=1&qty=5") != fp(query=b"qty=5&qty=1")
    assert fp(query=b"a=1&b=2&a=3") == fp(query=b"b=2&a=1&a=3")
    assert fp(query=b"a=1&b=2&a=3") != fp(query=b"a=3&b=2&a=1")


def test_query_values_matter() -> None:
    assert fp(query=b"a=1") != fp(query=b"a=2")
    assert fp(query=b"a=1") != fp()
    assert fp(query=b"a") != fp(query=b"b")
    assert fp(query=b"a=1&a=2") != fp(query=b"a=1")


def test_percent_escapes_that_are_not_utf8_stay_distinct() -> None:
    assert fp(query=b"a=%FF") != fp(query=b"a=%FE")
    assert fp(query=b"a=%C3%A9") != fp(query=b"a=%C3%A8")


@pytest.mark.parametrize(
    "other", [b'{"a": 2}', b'{"a": 1} ', b'{"a":1}', b"", b'{"a": 1}\x00'], ids=repr
)
def test_raw_mode_any_body_byte_change_changes_the_fingerprint(other: bytes) -> None:
    assert fp(other) != fp()


def test_canonical_json_ignores_key_order_and_white_space() -> None:
    a = fp(b'{"a": 1, "b": [1, 2]}', canonical_json=True)
    b = fp(b'{\n  "b":[1,2],\n  "a":1\n}', canonical_json=True)
    assert a == b


def test_canonical_json_still_sees_value_changes() -> None:
    assert fp(b'{"a": 1}', canonical_json=True) != fp(b'{"a": 2}', canonical_json=True)
    assert fp(b"[1, 2]", canonical_json=True) != fp(b"[2, 1]", canonical_json=True)


@pytest.mark.parametrize(
    "content_type", [b"application/json", b"application/problem+json", b"Application/JSON"]
)
def test_canonical_json_applies_to_json_content_types(content_type: bytes) -> None:
    assert fp(b'{"a":1,"b":2}', canonical_json=True, content_type=content_type) == fp(
        b'{"b": 2, "a": 1}', canonical_json=True, content_type=content_type
    )


@pytest.mark.parametrize("content_type", [b"text/plain", b"application/x-www-form-urlencoded", b""])
def test_canonical_json_does_not_apply_to_other_content_types(content_type: bytes) -> None:
    assert fp(b'{"a":1,"b":2}', canonical_json=True, content_type=content_type) != fp(
        b'{"b": 2, "a": 1}', canonical_json=True, content_type=content_type
    )


def test_invalid_json_falls_back_to_raw_bytes() -> None:
    broken = b'{"a": 1,'
    assert fp(broken, canonical_json=True) == fp(broken, canonical_json=False)
    assert fp(broken, canonical_json=True) != fp(broken + b" ", canonical_json=True)


def test_deeply_nested_json_falls_back_to_raw_bytes_without_error() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    assert fp(deep, canonical_json=True) == fp(deep, canonical_json=False)


def test_canonical_form_never_equals_a_raw_body() -> None:
    # The canonical form of {"a": 1} is {"a":1}; a raw body with those bytes is another request
    # only if hashing tags the two modes apart.
    assert fp(b'{"a": 1}', canonical_json=True) != fp(b'{"a":1}', content_type=b"text/plain")


def test_canonical_json_off_by_default() -> None:
    assert fp(b'{"a":1,"b":2}') != fp(b'{"b":2,"a":1}')


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (b'{"amount": 0.1}', b'{"amount": 0.10000000000000001}'),
        (b'{"amount": 1e400}', b'{"amount": 2e400}'),
        (b'{"amount": 1.5}', b'{"amount": 1.50}'),
    ],
)
def test_canonical_json_never_folds_numbers_a_decimal_parser_tells_apart(
    one: bytes, other: bytes
) -> None:
    assert fp(body=one, canonical_json=True, content_type=JSON) != fp(
        body=other, canonical_json=True, content_type=JSON
    )


def test_canonical_json_still_applies_to_ordinary_numbers() -> None:
    one = b'{"amount": 12.5, "n": 3, "x": -0.0, "e": 1e+21}'
    other = b'{"e":1e+21,"x":-0.0,"n":3,"amount":12.5}'
    assert fp(body=one, canonical_json=True, content_type=JSON) == fp(
        body=other, canonical_json=True, content_type=JSON
    )
