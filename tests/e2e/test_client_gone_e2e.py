"""A client that leaves before its request body is complete, on real servers and sockets: the
ASGI shell under uvicorn, the WSGI shell under gunicorn, the Django middleware under gunicorn
(its sync path) and under uvicorn (its async path). Nothing runs, no key is reserved (the retry
runs at once), and nothing fails on the server."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from ..django.server import DjangoDemo, django_demo
from .servers import DemoServer
from .test_wsgi_gunicorn import Gunicorn

__all__ = ["django_demo"]

pytestmark = pytest.mark.e2e

ORDER = b'{"item": "book", "quantity": 2}'


@dataclass
class Front:
    """One real server with a protected ``POST /orders``.

    Attributes:
        url: its base URL.
        count: the number of orders it made.
        log: its output so far.
        answers_half_close: a client that only closed its sending side reads the shell's
            ``400`` (gunicorn reads the body's end as the stream's end); uvicorn takes the end of
            the client's data as a disconnect and answers nothing.
    """

    url: str
    count: Callable[[], int]
    log: Callable[[], str]
    answers_half_close: bool


def _orders(url: str) -> int:
    return int(httpx.get(url + "/orders?limit=0", timeout=10).json()["count"])


@pytest.fixture(params=["asgi-uvicorn", "wsgi-gunicorn", "django-gunicorn", "django-uvicorn"])
def front(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    demo_servers: Callable[..., DemoServer],
    django_demo: Callable[..., DjangoDemo],
) -> Iterator[Front]:
    store = f"sqlite:///{tmp_path}/store.db"
    if request.param == "asgi-uvicorn":
        demo = demo_servers(store)
        yield Front(demo.url, lambda: _orders(demo.url), demo.log_text, False)
    elif request.param == "wsgi-gunicorn":
        workdir = tmp_path / "work"
        workdir.mkdir()
        gunicorn = Gunicorn(store, workdir)
        try:
            yield Front(gunicorn.url, gunicorn.effects, gunicorn.log.read_text, True)
        finally:
            gunicorn.stop()
    else:
        server = django_demo(store, workers=1, asgi=request.param == "django-uvicorn")
        yield Front(server.url, lambda: _orders(server.url), server.text, not server.asgi)


def _send_part(url: str, key: str, *, half_close: bool) -> bytes:
    """``POST /orders`` declaring 10 bytes more than it sends; then the client closes the
    connection, or only its sending side (and reads what comes back). What arrived is a whole
    order, so a shell that took it for the body would run it (and replay it to the retry)."""
    host, port = url.removeprefix("http://").split(":")
    head = (
        f"POST /orders HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f'Idempotency-Key: "{key}"\r\nContent-Length: {len(ORDER) + 10}\r\n\r\n'
    ).encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + ORDER)
        if not half_close:
            return b""
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


@pytest.mark.parametrize("half_close", [False, True], ids=["closed", "half-closed"])
def test_a_client_that_leaves_mid_body_runs_nothing_and_its_retry_runs_at_once(
    front: Front, half_close: bool
) -> None:
    key = str(uuid.uuid4())
    answer = _send_part(front.url, key, half_close=half_close)
    if half_close and front.answers_half_close:
        assert answer.startswith(b"HTTP/1.1 400 "), answer
    elif half_close:
        assert answer == b""
    headers = {"Content-Type": "application/json", "Idempotency-Key": f'"{key}"'}
    retry = httpx.post(front.url + "/orders", content=ORDER, headers=headers, timeout=20)
    assert retry.status_code == 201, retry.text
    assert "idempotency-replayed" not in retry.headers
    replay = httpx.post(front.url + "/orders", content=ORDER, headers=headers, timeout=20)
    assert replay.headers["idempotency-replayed"] == "true"
    assert replay.content == retry.content
    time.sleep(0.5)  # a cut request that wrongly ran would have finished by now
    assert front.count() == 1
    assert "Traceback" not in front.log()
