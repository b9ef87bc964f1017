"""``python -m retrysafe.client ... | head``: a reader that stops early is not an error of the
request, so there is no BrokenPipeError traceback and the exit status is the answer's."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

BODY = b'{"items": "' + b"x" * 1_000_000 + b'"}\n'  # more than a pipe buffer holds


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize(
    "command",
    [[sys.executable, "-m", "retrysafe.client"], [sys.executable, "-m", "retrysafe", "request"]],
    ids=["python-m-retrysafe.client", "retrysafe-request"],
)
def test_a_reader_that_stops_early_gets_no_traceback(server: str, command: list[str]) -> None:
    proc = subprocess.Popen(
        [*command, "POST", server + "/orders", "--json", "{}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == b"status: 201\n"  # what `head -1` reads
    proc.stdout.close()  # ... and then it exits
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 0, stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
