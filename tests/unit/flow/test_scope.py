"""Who a request acts for, and what makes it "the same request": the record id and the
fingerprint a :class:`Flow` derives from the neutral request (DESIGN 3.6)."""

from __future__ import annotations

from typing import Any

import pytest

from retrysafe import Request
from retrysafe._core.fingerprint import fingerprint
from retrysafe._core.keys import record_id
from retrysafe._core.scope import authorization_scope, default_principal, user_scope

from .script import flow_for, make_request


class User:
    """A framework user object (Starlette ``BaseUser``, Django ``User``)."""

    def __init__(self, authenticated: bool = True, **attributes: Any) -> None:
        self.is_authenticated = authenticated
        for name, value in attributes.items():
            setattr(self, name, value)


class StarletteLikeUser:
    """``identity`` raises ``NotImplementedError`` on Starlette's ``BaseUser``."""

    is_authenticated = True
    display_name = "ann"

    @property
    def identity(self) -> str:
        raise NotImplementedError


def _record_of(**request: Any) -> str:
    return flow_for(make_request(**request)).record_id


# -- the default principal -----------------------------------------------------------------------


def test_the_record_id_hashes_principal_method_path_and_key() -> None:
    flow = flow_for(make_request(method="PATCH", path="/a", user="ann"), key="k-9")
    assert flow.record_id == record_id("user:ann", "PATCH", "/a", "k-9")
    assert "k-9" not in flow.record_id


def test_without_user_or_credentials_the_scope_is_global() -> None:
    assert default_principal(make_request()) == ""
    assert _record_of() == record_id("", "POST", "/orders", "k-1")


@pytest.mark.parametrize(
    ("user", "principal"),
    [
        ("alice", "user:alice"),
        (User(identity="u-1"), "user:u-1"),
        (User(pk=42), "user:42"),
        (User(id=7, username="bob"), "user:7"),
        (User(username="bob"), "user:bob"),
        (User(identity="", username="eve"), "user:eve"),
        (StarletteLikeUser(), "user:ann"),
    ],
    ids=["remote-user", "identity", "pk", "id-first", "username", "empty-skipped", "starlette"],
)
def test_an_authenticated_user_is_the_principal(user: Any, principal: str) -> None:
    assert user_scope(user) == principal
    assert default_principal(make_request(user=user, authorization=b"Bearer x")) == principal


@pytest.mark.parametrize(
    "user",
    [None, "", User(authenticated=False, pk=1), User(), object()],
    ids=["none", "empty", "unauthenticated", "no-identity", "object"],
)
def test_no_authenticated_user_falls_back_to_the_authorization_header(user: Any) -> None:
    request = make_request(user=user, authorization=b"Bearer abc")
    assert user_scope(user) is None
    assert default_principal(request) == authorization_scope(b"Bearer abc")
    assert default_principal(request).startswith("auth:")


@pytest.mark.parametrize(
    "same",
    [
        b"bearer abc",
        b"BEARER abc",
        b"Bearer    abc",
        b"  Bearer abc\t",
        b"Bearer abc ",
        "Bearer abc",
    ],
)
def test_equal_credentials_written_differently_are_one_scope(same: bytes | str) -> None:
    assert authorization_scope(same) == authorization_scope(b"Bearer abc")


@pytest.mark.parametrize("other", [b"Bearer ABC", b"Bearer abd", b"Basic abc"])
def test_different_credentials_are_different_scopes(other: bytes) -> None:
    # Only the scheme is case-insensitive: credentials are compared as sent.
    assert authorization_scope(other) != authorization_scope(b"Bearer abc")


def test_a_bare_token_without_scheme_is_compared_exactly() -> None:
    # An API key sent as the whole Authorization value: its case is part of the secret.
    assert authorization_scope(b"KeyAbC-x") != authorization_scope(b"keyabc-x")
    assert authorization_scope(b" KeyAbC-x ") == authorization_scope(b"KeyAbC-x")


def test_the_raw_credentials_never_appear_in_the_scope() -> None:
    assert "s3cret" not in authorization_scope(b"Bearer s3cret")


def test_two_users_with_one_key_get_two_records() -> None:
    assert _record_of(user="ann") != _record_of(user="bob")
    assert _record_of(authorization=b"Bearer a") != _record_of(authorization=b"Bearer b")
    assert _record_of(authorization=b"bearer  a") == _record_of(authorization=b"Bearer a")


def test_a_scope_resolver_receives_the_neutral_request_and_overrides_the_default() -> None:
    seen: list[Request] = []

    def resolver(request: Request) -> str:
        seen.append(request)
        return "tenant:" + (request.header("x-tenant") or "")

    request = make_request(user="ann", headers=[(b"x-tenant", b"acme")])
    flow = flow_for(request, scope_resolver=resolver)
    assert seen == [request]
    assert flow.record_id == record_id("tenant:acme", "POST", "/orders", "k-1")


# -- the fingerprint -----------------------------------------------------------------------------


def test_the_fingerprint_covers_method_path_query_and_body() -> None:
    request = make_request(method="PATCH", path="/o/1", query=b"b=2&a=1")
    flow = flow_for(request, body=b"{}")
    assert flow.fingerprint == fingerprint(
        "PATCH", "/o/1", b"b=2&a=1", b"{}", content_type=b"application/json"
    )
    assert (
        flow.fingerprint
        == flow_for(
            make_request(method="PATCH", path="/o/1", query=b"a=1&b=2"), body=b"{}"
        ).fingerprint
    )
    assert flow.fingerprint != flow_for(request, body=b"{ }").fingerprint


def test_canonical_json_comes_from_the_config() -> None:
    a = b'{"a":1,"b":2}'
    b = b'{ "b": 2, "a": 1 }'
    assert flow_for(body=a).fingerprint != flow_for(body=b).fingerprint
    assert (
        flow_for(body=a, canonical_json=True).fingerprint
        == flow_for(body=b, canonical_json=True).fingerprint
    )


def test_the_fingerprint_does_not_depend_on_who_sends_it() -> None:
    # Scope goes into the record id, not the fingerprint: one user's retry matches itself.
    ann = flow_for(make_request(user="ann"))
    bob = flow_for(make_request(user="bob"))
    assert ann.fingerprint == bob.fingerprint
    assert ann.record_id != bob.record_id
