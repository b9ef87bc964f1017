"""What is stored and for whom: the status policy, the replayed headers and the key scopes
(DESIGN sections 2 and 3.6), on every shell and every store."""

from __future__ import annotations

import pytest

import retrysafe

from .conftest import ServiceFactory
from .harness import REPLAYED, Service, World

ORDER = {"item": "book", "quantity": 2}


# -- status policy ----------------------------------------------------------------------------


@pytest.mark.parametrize("status", [500, 502, 503, 400, 401, 403, 408, 409, 413, 415, 422, 429])
def test_5xx_and_request_level_rejections_release_the_key(
    svc: Service, world: World, status: int
) -> None:
    first = svc.post(key="k1", params={"status": str(status)})
    second = svc.post(key="k1", params={"status": str(status)})
    assert first.status_code == second.status_code == status
    assert REPLAYED not in second.headers
    assert (first.json()["call"], second.json()["call"]) == (1, 2)


@pytest.mark.parametrize("status", [200, 201, 202, 204, 303, 404, 410])
def test_2xx_3xx_and_other_4xx_are_stored_and_replayed(
    svc: Service, world: World, status: int
) -> None:
    first = svc.post(key="k1", params={"status": str(status)})
    second = svc.post(key="k1", params={"status": str(status)})
    assert second.status_code == first.status_code == status
    assert second.headers[REPLAYED] == "true"
    assert second.content == first.content
    assert second.headers["location"] == first.headers["location"]
    assert world["/orders"] == 1


def test_store_server_errors_keeps_5xx(make_service: ServiceFactory, world: World) -> None:
    svc = make_service(store_server_errors=True)
    first = svc.post(key="k1", params={"status": "503"})
    second = svc.post(key="k1", params={"status": "503"})
    assert second.status_code == 503
    assert second.headers[REPLAYED] == "true"
    assert second.content == first.content
    assert world["/orders"] == 1


def test_release_statuses_setting_replaces_the_default(
    make_service: ServiceFactory, world: World
) -> None:
    svc = make_service(release_statuses=frozenset({404}))
    svc.post(key="a", params={"status": "404"})
    not_found = svc.post(key="a", params={"status": "404"})
    svc.post(key="b", params={"status": "409"})
    conflict = svc.post(key="b", params={"status": "409"})
    server_error = [svc.post(key="c", params={"status": "500"}) for _ in range(2)]
    assert REPLAYED not in not_found.headers
    assert conflict.headers[REPLAYED] == "true"
    assert REPLAYED not in server_error[1].headers  # 5xx stay released
    assert world["/orders"] == 5


# -- replayed headers -------------------------------------------------------------------------

CREDENTIALS = [
    "h=WWW-Authenticate:Bearer realm=x",
    "h=Authentication-Info:nextnonce=1",
    "h=Proxy-Authenticate:Basic",
    "h=X-Kept:yes",
]


def test_set_cookie_and_deny_listed_headers_are_never_replayed(svc: Service) -> None:
    query = "&".join(CREDENTIALS)
    first = svc.post(f"/orders?{query}", key="k1")
    replay = svc.post(f"/orders?{query}", key="k1")
    assert first.headers["set-cookie"] == "session=1"
    assert first.headers["www-authenticate"] == "Bearer realm=x"
    assert replay.headers[REPLAYED] == "true"
    for name in ("set-cookie", "www-authenticate", "authentication-info", "proxy-authenticate"):
        assert name not in replay.headers, name
    assert replay.headers["x-kept"] == "yes"
    assert replay.headers["x-custom"] == "c1"


def test_repeated_header_fields_are_all_replayed_in_order(svc: Service) -> None:
    query = "h=Link:</a>; rel=first&h=Vary:Accept&h=Link:</b>; rel=second&h=Vary:Origin"
    first = svc.post(f"/orders?{query}", key="k1")
    replay = svc.post(f"/orders?{query}", key="k1")
    assert first.headers.get_list("link") == ["</a>; rel=first", "</b>; rel=second"]
    assert replay.headers[REPLAYED] == "true"
    assert replay.headers.get_list("link") == first.headers.get_list("link")
    assert replay.headers.get_list("vary") == ["Accept", "Origin"]


def test_custom_denylist_drops_more_headers(make_service: ServiceFactory) -> None:
    svc = make_service(replay_header_denylist=frozenset({"X-Custom", "set-cookie"}))
    first = svc.post(key="k1", json=ORDER)
    replay = svc.post(key="k1", json=ORDER)
    assert first.headers["x-custom"] == "c1"
    assert "x-custom" not in replay.headers
    assert "set-cookie" not in replay.headers
    assert replay.headers["etag"] == '"v1"'


def test_allowlist_keeps_only_the_listed_headers(make_service: ServiceFactory) -> None:
    allow = frozenset({"Location", "Content-Type", "Set-Cookie"})
    svc = make_service(replay_header_allowlist=allow)
    first = svc.post(key="k1", json=ORDER)
    replay = svc.post(key="k1", json=ORDER)
    assert replay.headers["location"] == "/orders/1"
    assert replay.headers["content-type"] == "application/json"
    assert "etag" not in replay.headers
    assert "x-custom" not in replay.headers
    # The deny-list still wins over the allow-list.
    assert "set-cookie" not in replay.headers
    assert replay.content == first.content


# -- scoping (guarantee 6) --------------------------------------------------------------------


def test_keys_are_scoped_by_the_authorization_header(svc: Service, world: World) -> None:
    alice = {"Authorization": "Bearer alice"}
    bob = {"Authorization": "Bearer bob"}
    a1 = svc.post(key="k1", json=ORDER, headers=alice)
    b1 = svc.post(key="k1", json=ORDER, headers=bob)
    anonymous = svc.post(key="k1", json=ORDER)
    a2 = svc.post(key="k1", json=ORDER, headers=alice)
    b2 = svc.post(key="k1", json=ORDER, headers=bob)
    assert world["/orders"] == 3
    assert a2.content == a1.content and b2.content == b1.content
    assert a1.json()["auth"] == "Bearer alice" and b1.json()["auth"] == "Bearer bob"
    assert REPLAYED not in anonymous.headers
    assert a2.headers[REPLAYED] == b2.headers[REPLAYED] == "true"


@pytest.mark.parametrize("variant", ["Bearer  alice", "bearer alice", "BEARER    alice"])
def test_equal_credentials_written_differently_share_a_scope(
    svc: Service, world: World, variant: str
) -> None:
    # RFC 9110 section 11.4: the auth scheme is case-insensitive, and a run of spaces before
    # the credentials is one separator. The credentials themselves stay case-sensitive.
    first = svc.post(key="k1", json=ORDER, headers={"Authorization": "Bearer alice"})
    same = svc.post(key="k1", json=ORDER, headers={"Authorization": variant})
    other = svc.post(key="k1", json=ORDER, headers={"Authorization": "Bearer ALICE"})
    assert same.headers[REPLAYED] == "true"
    assert same.content == first.content
    assert REPLAYED not in other.headers
    assert world["/orders"] == 2


def test_a_bare_token_is_compared_exactly(svc: Service, world: World) -> None:
    # No scheme, so nothing is case-insensitive: an API key sent as the whole header value.
    first = svc.post(key="k1", json=ORDER, headers={"Authorization": "KeyAbC-x"})
    other = svc.post(key="k1", json=ORDER, headers={"Authorization": "keyabc-x"})
    assert first.status_code == other.status_code == 201
    assert REPLAYED not in other.headers
    assert world["/orders"] == 2


def test_repeated_authorization_fields_scope_by_all_of_them(svc: Service, world: World) -> None:
    # A framework reads the first field (Starlette) or all of them joined (a WSGI server): two
    # requests that differ in any field never share a record.
    alice = [("Authorization", "Bearer alice"), ("Authorization", "Bearer x")]
    bob = [("Authorization", "Bearer bob"), ("Authorization", "Bearer x")]
    first = svc.post(key="k1", json=ORDER, headers=alice)
    other = svc.post(key="k1", json=ORDER, headers=bob)
    again = svc.post(key="k1", json=ORDER, headers=alice)
    assert first.status_code == other.status_code == 201
    assert REPLAYED not in other.headers
    assert again.headers[REPLAYED] == "true" and again.content == first.content


def test_custom_scope_resolver_gets_the_neutral_request(
    make_service: ServiceFactory, world: World
) -> None:
    seen: list[retrysafe.Request] = []

    def tenant(request: retrysafe.Request) -> str:
        seen.append(request)
        return request.header("X-Tenant") or ""

    svc = make_service(scope_resolver=tenant)
    t1 = svc.post(key="k1", json=ORDER, headers={"X-Tenant": "t1"})
    t1_other_auth = svc.post(
        key="k1", json=ORDER, headers={"x-tenant": "t1", "Authorization": "Bearer x"}
    )
    t2 = svc.post(key="k1", json=ORDER, headers={"X-Tenant": "t2"})
    assert t1_other_auth.headers[REPLAYED] == "true"
    assert t1_other_auth.content == t1.content
    assert REPLAYED not in t2.headers
    assert world["/orders"] == 2
    assert all(isinstance(r, retrysafe.Request) for r in seen) and len(seen) == 3
    request = seen[1]
    assert (request.method, request.path) == ("POST", "/orders")
    assert request.header("authorization") == "Bearer x"
    assert request.header("Content-Type") == "application/json"
    assert request.header("X-Missing") is None
