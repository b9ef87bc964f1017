"""What a WSGI replay carries, against what the guide says: under Werkzeug's own server, a Flask
view's ``201 CREATED`` with ``Content-Type`` is replayed with the same status code, body and header
values, the names in lower case and the standard reason phrase (``201 Created``): the guide says
exactly that, and no page claims the status line or the header names are replayed byte for byte."""

from __future__ import annotations

import http.client
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask
from werkzeug.serving import make_server

from retrysafe.contrib.flask import Idempotency, idempotent

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def port(tmp_path: Path) -> Iterator[int]:
    app = Flask("replay_head")
    Idempotency(app, store=f"sqlite:///{tmp_path}/i.db")

    @app.post("/payments")
    @idempotent(required=True)
    def pay() -> tuple[dict[str, bool], int, dict[str, str]]:
        return {"paid": True}, 201, {"X-Receipt": "r-1", "ETag": '"v1"'}

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.port
    server.shutdown()
    Idempotency.state(app).store.close()


def _post(port: int) -> tuple[int, str, list[tuple[str, str]], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/payments", b"{}", {"Idempotency-Key": '"h1"'})
    answer = conn.getresponse()
    head = (answer.status, answer.reason, answer.getheaders(), answer.read())
    conn.close()
    return head


def test_a_replay_keeps_status_body_and_header_values_and_says_so(port: int) -> None:
    status, reason, headers, body = _post(port)
    again_status, again_reason, again_headers, again_body = _post(port)
    assert (status, reason) == (201, "CREATED")  # Werkzeug's own reason phrase
    assert (again_status, again_reason) == (201, "Created")  # the standard one
    assert again_body == body
    first = {name.lower(): value for name, value in headers}
    replay = dict(again_headers)
    for name in ("content-type", "x-receipt", "etag"):
        assert replay[name] == first[name]  # the stored names are lower case, values unchanged
    assert "Content-Type" in dict(headers) and "Content-Type" not in replay
    assert replay["idempotency-replayed"] == "true"


def test_the_docs_say_exactly_what_is_replayed() -> None:
    contract = ROOT / "docs" / "explanation" / "wire-contract.md"
    text = " ".join(contract.read_text().split())
    assert "the body, byte for byte" in text
    assert "names in lower case" in text
    assert "reason phrase is not stored" in text
    for page in (ROOT / "README.md", contract, ROOT / "docs" / "index.md"):
        text = " ".join(page.read_text().split())
        claims = re.findall(r"(\S+ \S+) byte for byte", text)
        assert all(claim.endswith("body,") for claim in claims), (page.name, claims)
