"""Through the sidecar to a real upstream: two requests the upstream would treat differently
never share a record, and query names in another order do (the model is tests/identity.py).
The upstream receives the raw path, so ``a%2Fb`` and ``a/b`` are two requests here."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from ..identity import Shape, pairs
from .conftest import Backend, Processes, Proxy

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def backend(module_processes: Processes) -> Iterator[Backend]:
    started = module_processes.backend()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def proxy(module_processes: Processes, backend: Backend) -> Iterator[Proxy]:
    store = f"sqlite:///{module_processes.log_dir.parent / 'identity.db'}"
    started = module_processes.proxy(backend.url, store)
    yield started
    started.stop()


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10.0) as c:
        yield c


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(case=pairs(byte_paths=True, raw_paths=True))
def test_requests_the_upstream_tells_apart_never_share_a_record(
    proxy: Proxy, backend: Backend, client: httpx.Client, case: tuple[Shape, Shape, bool, str]
) -> None:
    first, second, same, change = case
    key = str(uuid.uuid4())

    def send(shape: Shape) -> httpx.Response:
        headers = {"Idempotency-Key": f'"{key}"', **shape.headers}
        url = httpx.URL(proxy.url + shape.target)
        return client.post(url, content=shape.body, headers=headers)

    one = send(first)
    assert one.status_code == 201 and "idempotency-replayed" not in one.headers
    other = send(second)
    if same:
        assert other.headers.get("idempotency-replayed") == "true", (first, second)
        assert other.content == one.content
        assert len(backend.effects(key=f'"{key}"')) == 1
    else:
        assert "idempotency-replayed" not in other.headers, (change, first, second)
        assert other.status_code in (201, 422), (change, other.status_code)
