"""Idempotency-Key parsing (sf-string and bare token) and the scoped record id."""

from __future__ import annotations

import pytest

from retrysafe import InvalidKeyError
from retrysafe._core.keys import MAX_KEY_LENGTH, parse_key, record_id


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        (b'"7c9e6679-7425-40de-944b-e07fc1f90ae7"', "7c9e6679-7425-40de-944b-e07fc1f90ae7"),
        (b"7c9e6679-7425-40de-944b-e07fc1f90ae7", "7c9e6679-7425-40de-944b-e07fc1f90ae7"),
        (b'"with space"', "with space"),
        (b'"a\\"b"', 'a"b'),
        (b'"a\\\\b"', "a\\b"),
        (b'  "padded"\t', "padded"),
        (b" bare ", "bare"),
        (b'"a,b"', "a,b"),
    ],
)
def test_parse_key_accepts_sf_strings_with_escapes_and_bare_tokens(raw: bytes, key: str) -> None:
    assert parse_key([raw]) == key


def test_quoted_and_bare_forms_of_one_key_are_the_same_key() -> None:
    assert parse_key([b'"abc"']) == parse_key([b"abc"])


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "empty"),
        (b"   ", "empty"),
        (b'""', "empty"),
        (b'"abc', "not terminated"),
        (b'"', "not terminated"),
        (b'"abc\\', "escape"),
        (b'"a\\nb"', "escape"),
        (b'"abc"def', "after the closing quote"),
        (b'"abc" , "def"', "after the closing quote"),
        (b"a b", "bare key"),
        (b'ab"c', "bare key"),
        (b"a\\b", "bare key"),
        (b"a,b", "bare key"),
        (b"abc\x01", "printable"),
        (b'"abc\x00"', "printable"),
        (b"abc\x7f", "printable"),
        (b'"a\tb"', "printable"),
        ("caf\u00e9".encode(), "printable"),
        (b"\xff\xfe", "printable"),
    ],
)
def test_parse_key_rejects_malformed_values(raw: bytes, reason: str) -> None:
    with pytest.raises(InvalidKeyError) as info:
        parse_key([raw])
    assert reason in info.value.reason


def test_key_of_255_characters_is_accepted_and_256_is_rejected() -> None:
    assert MAX_KEY_LENGTH == 255
    assert parse_key([b"k" * 255]) == "k" * 255
    assert parse_key([b'"' + b"k" * 255 + b'"']) == "k" * 255
    with pytest.raises(InvalidKeyError, match="longer than 255"):
        parse_key([b"k" * 256])
    with pytest.raises(InvalidKeyError, match="longer than 255"):
        parse_key([b'"' + b"k" * 256 + b'"'])


def test_length_limit_counts_unescaped_characters() -> None:
    # 255 escaped quotes are 510 bytes on the wire but a 255-character key.
    assert parse_key([b'"' + b'\\"' * 255 + b'"']) == '"' * 255


@pytest.mark.parametrize("values", [[], [b"a", b"a"], [b'"a"', b'"b"']])
def test_parse_key_requires_exactly_one_header_field(values: list[bytes]) -> None:
    with pytest.raises(InvalidKeyError, match="exactly once"):
        parse_key(values)


def test_invalid_key_reason_never_contains_the_key() -> None:
    secret = "s3cr3t-key-material"
    with pytest.raises(InvalidKeyError) as info:
        parse_key([f"{secret} x".encode()])
    assert secret not in str(info.value)


BASE = ("user:alice", "POST", "/orders", "key-1")


def test_record_id_is_a_sha256_hex_digest_without_the_raw_key() -> None:
    rid = record_id(*BASE)
    assert len(rid) == 64
    int(rid, 16)
    assert "key-1" not in rid
    assert record_id(*BASE) == rid


@pytest.mark.parametrize(
    "changed",
    [
        ("user:bob", "POST", "/orders", "key-1"),
        ("", "POST", "/orders", "key-1"),
        ("user:alice", "PATCH", "/orders", "key-1"),
        ("user:alice", "POST", "/payments", "key-1"),
        ("user:alice", "POST", "/orders", "key-2"),
    ],
    ids=["scope", "global-scope", "method", "route", "key"],
)
def test_record_id_changes_with_scope_method_route_and_key(
    changed: tuple[str, str, str, str],
) -> None:
    assert record_id(*changed) != record_id(*BASE)


def test_record_id_parts_cannot_be_shifted_into_each_other() -> None:
    assert record_id("ab", "POST", "/x", "k") != record_id("a", "bPOST", "/x", "k")
    assert record_id("", "POST", "/x", "k1") != record_id("", "POST", "/xk", "1")
