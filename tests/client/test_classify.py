"""Each library's exceptions map to the right Failure class: by type, and as raised by real
sockets (a refused port is NOT_SENT, a reset after the request left is LOST)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import httpx
import pytest
import requests
import urllib3.exceptions

from retrysafe.client import (
    Failure,
    RetriesExhaustedError,
    RetryingAdapter,
    RetryingTransport,
    RetryPolicy,
)
from retrysafe.client._httpx import classify as classify_httpx
from retrysafe.client._requests import classify as classify_requests

from ..e2e.servers import DemoServer, free_port
from .faultproxy import FaultProxy

HTTPX_CASES = [
    (httpx.ConnectError, Failure.NOT_SENT),
    (httpx.ConnectTimeout, Failure.NOT_SENT),
    (httpx.PoolTimeout, Failure.NOT_SENT),
    (httpx.ReadError, Failure.LOST),
    (httpx.WriteError, Failure.LOST),
    (httpx.CloseError, Failure.LOST),
    (httpx.ReadTimeout, Failure.LOST),
    (httpx.WriteTimeout, Failure.LOST),
    (httpx.RemoteProtocolError, Failure.LOST),
    (httpx.LocalProtocolError, Failure.FATAL),
    (httpx.UnsupportedProtocol, Failure.FATAL),
    (httpx.ProxyError, Failure.FATAL),
]


@pytest.mark.parametrize(("exc", "failure"), HTTPX_CASES, ids=[c[0].__name__ for c in HTTPX_CASES])
def test_httpx_exceptions(exc: type[httpx.TransportError], failure: Failure) -> None:
    assert classify_httpx(exc("boom")) is failure


def _refused() -> urllib3.exceptions.MaxRetryError:
    reason = urllib3.exceptions.NewConnectionError(None, "refused")  # type: ignore[arg-type]
    return urllib3.exceptions.MaxRetryError(None, "/", reason)  # type: ignore[arg-type]


REQUESTS_CASES = [
    ("connect-timeout", requests.exceptions.ConnectTimeout("t"), Failure.NOT_SENT),
    ("refused", requests.exceptions.ConnectionError(_refused()), Failure.NOT_SENT),
    (
        "aborted",
        requests.exceptions.ConnectionError(urllib3.exceptions.ProtocolError("aborted")),
        Failure.LOST,
    ),
    ("bare-connection-error", requests.exceptions.ConnectionError(), Failure.LOST),
    ("read-timeout", requests.exceptions.ReadTimeout("t"), Failure.LOST),
    ("chunked", requests.exceptions.ChunkedEncodingError("c"), Failure.LOST),
    ("ssl", requests.exceptions.SSLError("s"), Failure.FATAL),
    ("proxy", requests.exceptions.ProxyError("p"), Failure.FATAL),
    ("invalid-url", requests.exceptions.InvalidURL("u"), Failure.FATAL),
    ("missing-schema", requests.exceptions.MissingSchema("m"), Failure.FATAL),
]


@pytest.mark.parametrize(
    ("exc", "failure"), [c[1:] for c in REQUESTS_CASES], ids=[c[0] for c in REQUESTS_CASES]
)
def test_requests_exceptions(exc: requests.RequestException, failure: Failure) -> None:
    assert classify_requests(exc) is failure


def unkeyed(max_attempts: int = 3) -> RetryPolicy:
    return RetryPolicy(
        add_keys=False,
        max_attempts=max_attempts,
        backoff_max=0.05,
        backoff_initial=0.01,
        rng=random.Random(0),
    )


@pytest.fixture
def resetting_proxy(orderhub: DemoServer) -> Iterator[FaultProxy]:
    proxy = FaultProxy(orderhub.port, lambda n: ["reset"])
    proxy.start()
    yield proxy
    proxy.stop()


@pytest.mark.e2e
@pytest.mark.parametrize("library", ["httpx", "requests"])
def test_a_refused_post_without_key_is_resent_a_reset_one_is_not(
    library: str, resetting_proxy: FaultProxy
) -> None:
    refused = f"http://127.0.0.1:{free_port()}/orders"
    reset = resetting_proxy.url + "/orders"
    if library == "httpx":
        with httpx.Client(transport=RetryingTransport(policy=unkeyed()), timeout=5) as client:
            with pytest.raises(RetriesExhaustedError) as caught:
                client.post(refused, json={})
            assert isinstance(caught.value.__cause__, httpx.ConnectError)
            with pytest.raises(httpx.TransportError):
                client.post(reset, json={})
    else:
        with requests.Session() as session:
            session.mount("http://", RetryingAdapter(unkeyed()))
            with pytest.raises(RetriesExhaustedError) as caught:
                session.post(refused, json={}, timeout=5)
            assert isinstance(caught.value.__cause__, requests.ConnectionError)
            with pytest.raises(requests.ConnectionError):
                session.post(reset, json={}, timeout=5)
    assert (caught.value.attempts, caught.value.key) == (3, None)
    # The reset request had no key and might have run: sent once.
    assert resetting_proxy.seen == {"": 1}
