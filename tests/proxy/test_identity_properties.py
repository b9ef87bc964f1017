"""Through the sidecar to a real upstream: two requests the upstream would treat differently
never share a record, and query names in another order do (the model is tests/identity.py).
The upstream receives the raw path, so ``a%2Fb`` and ``a/b`` are two requests here."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from ..identity import Shape, check_pair, pairs
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


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(case=pairs(byte_paths=True, raw_paths=True))
def test_requests_the_upstream_tells_apart_never_share_a_record(
    proxy: Proxy, client: httpx.Client, case: tuple[Shape, Shape, bool, str]
) -> None:
    def send(shape: Shape, key: str) -> tuple[int, bool, bytes]:
        headers = {"Idempotency-Key": f'"{key}"', **shape.headers}
        response = client.post(
            httpx.URL(proxy.url + shape.target), content=shape.body, headers=headers
        )
        return response.status_code, "idempotency-replayed" in response.headers, response.content

    check_pair(send, case)
