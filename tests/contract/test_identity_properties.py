"""Two requests the application would treat differently never share a record; two it treats
the same (query names in another order) do: a property over generated requests, on every shell
through its own client (Starlette over ASGI, a bare WSGI app as a server drives it, Flask's and
Django's test clients). The model is tests/identity.py."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from ..identity import Shape, check_pair, pairs
from .harness import REPLAYED, Service

#: The shells whose application receives a path's bytes that are not UTF-8 (raw_path, PATH_INFO,
#: Django's request.path); Werkzeug's test client and Django's ASGI request decode them first.
BYTE_PATHS = {"asgi", "wsgi", "django"}

PROPERTY = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@pytest.mark.parametrize("backend", ["memory"], indirect=True)
def test_requests_the_app_tells_apart_never_share_a_record(svc: Service, shell: str) -> None:
    def send(shape: Shape, key: str) -> tuple[int, bool, bytes]:
        response = svc.post(shape.target, key=key, headers=shape.headers, content=shape.body)
        return response.status_code, response.headers.get(REPLAYED) == "true", response.content

    @PROPERTY
    @given(case=pairs(byte_paths=shell in BYTE_PATHS, raw_paths=shell == "asgi"))
    def check(case: tuple[Shape, Shape, bool, str]) -> None:
        check_pair(send, case)

    check()
