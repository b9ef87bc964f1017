"""One flow for every front: an app served by an async front (the ASGI shell, or Django's ASGI
path) and a sync one (the WSGI shell, Flask under ``retrysafe.contrib.flask``, or Django's WSGI
path) at once over one store (a mixed fleet, a migration from one framework or deployment to
another) keeps one record per request, and a ``scope_resolver`` sees the same neutral request
on both."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import retrysafe

from .conftest import Backend, ServiceFactory
from .harness import REPLAYED, Service, World

ORDER = {"item": "book", "quantity": 2}

# The backend fixture builds the async face; the other face (``other``) is opened over the same
# data with the backend's sync store.
pytestmark = pytest.mark.parametrize(
    ("shell", "other"),
    [
        pytest.param("asgi", "wsgi", id="asgi+wsgi"),
        pytest.param("asgi", "flask", id="asgi+flask"),
        pytest.param("asgi", "django", id="asgi+django"),
        # One Django project deployed under ASGI and WSGI at once (a move from one to the other).
        pytest.param("django-async", "django", id="django-async+django"),
    ],
)


@pytest.fixture
def fronts(
    backend: Backend, make_service: ServiceFactory, world: World, other: str
) -> Iterator[tuple[Service, Service]]:
    asgi = make_service()
    wsgi = Service(other, backend.wsgi_store(), world)
    yield asgi, wsgi
    wsgi.close()


@pytest.mark.parametrize("path", ["/orders", "/orders/caf%C3%A9"], ids=["ascii", "utf8"])
def test_a_request_served_by_one_front_is_replayed_by_the_other(
    fronts: tuple[Service, Service], world: World, path: str
) -> None:
    asgi, wsgi = fronts
    for first_front, second_front, key in ((asgi, wsgi, "k1"), (wsgi, asgi, "k2")):
        first = first_front.post(path, key=key, json=ORDER)
        replay = second_front.post(path, key=key, json=ORDER)
        assert first.status_code == 201
        assert replay.headers.get(REPLAYED) == "true", (first_front.shell, replay.text)
        assert replay.content == first.content
    assert sum(world.runs[p] for p in world.runs if p != "closed") == 2


def test_authorization_scopes_agree_across_fronts(
    fronts: tuple[Service, Service], world: World
) -> None:
    asgi, wsgi = fronts
    first = asgi.post(key="k1", json=ORDER, headers={"Authorization": "Bearer alice"})
    same = wsgi.post(key="k1", json=ORDER, headers={"Authorization": "bearer  alice"})
    other = wsgi.post(key="k1", json=ORDER, headers={"Authorization": "Bearer bob"})
    assert same.headers[REPLAYED] == "true" and same.content == first.content
    assert REPLAYED not in other.headers
    assert world["/orders"] == 2


def test_a_running_request_on_one_front_is_a_409_on_the_other(
    fronts: tuple[Service, Service], world: World
) -> None:
    asgi, wsgi = fronts
    running = wsgi.background(key="k1", json=ORDER, params={"hold": "1"})
    world.wait_entered()
    conflict = asgi.post(key="k1", json=ORDER, params={"hold": "1"})
    world.open()
    done = running.result()
    replay = asgi.post(key="k1", json=ORDER, params={"hold": "1"})
    assert conflict.status_code == 409
    assert replay.content == done.content and replay.headers[REPLAYED] == "true"
    assert world["/orders"] == 1


def test_scope_resolver_sees_the_same_neutral_request_on_both_fronts(
    backend: Backend, make_service: ServiceFactory, world: World, shell: str, other: str
) -> None:
    seen: dict[str, retrysafe.Request] = {}

    def resolver(request: retrysafe.Request) -> str:
        seen[request.header("x-front") or ""] = request
        return ""

    asgi = make_service(scope_resolver=resolver)
    wsgi = Service(other, backend.wsgi_store(), world, scope_resolver=resolver)
    try:
        path = "/orders/caf%C3%A9"
        query = {"q": "1"}
        for front in (asgi, wsgi):
            headers = {"X-Front": front.shell, "Authorization": "Bearer a"}
            front.post(path, key="k1", json=ORDER, params=query, headers=headers)
    finally:
        wsgi.close()
    a, w = seen[shell], seen[other]
    assert (a.method, a.path, a.query) == ("POST", "/orders/café", b"q=1")
    names = ("method", "path", "query", "keys", "content_length", "content_type")
    differ = {n: (getattr(a, n), getattr(w, n)) for n in (*names, "authorization", "user")}
    assert {n: v for n, v in differ.items() if v[0] != v[1]} == {}
