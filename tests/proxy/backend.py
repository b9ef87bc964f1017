"""A backend with no idempotency at all, run as a real process behind ``retrysafe proxy``.

Standard library only (``http.server``), so it stands for "a backend in any language". Every
effect (an order created, an upload received) is appended as one JSON line to ``--effects``,
written and flushed *before* the answer, so a test can count effects even when the answer is
lost. Run: ``python backend.py --port P --effects FILE``.

Routes:
    POST/PATCH /orders, /payments, /orders/...: one effect; ``201`` + ``Location``. Knobs (query):
        ``delay_ms`` sleep after the effect, before answering; ``die=1`` exit right after the
        effect, never answering; ``status=N`` answer N; ``size=N`` a chunked body of N bytes;
        ``cut=1`` (with ``size``) exit half-way through that body.
    POST /upload: one effect with the body's size and SHA-256 (chunked bodies understood).
    any /echo: the request line and headers as received; the answer carries hop-by-hop fields.
    GET /health: 200 (HEAD: its head, no body).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

_lock = threading.Lock()
_effects_path = ""


def _count() -> int:
    try:
        with open(_effects_path, encoding="utf-8") as handle:
            return sum(1 for _ in handle)
    except FileNotFoundError:
        return 0


def _record(effect: dict[str, object]) -> int:
    with _lock:
        number = _count() + 1
        effect["id"] = number
        effect["pid"] = os.getpid()
        with open(_effects_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(effect) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return number


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body are separate writes: without TCP_NODELAY, delayed ACKs add 40 ms.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet: the tests read effects, not logs

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline().strip():
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/health":
            self._send(200, b'{"ok":true}')
        elif path == "/echo":
            self._echo(b"")
        else:
            self._send(404, b'{"error":"not found"}')

    def do_HEAD(self) -> None:
        # The head of GET /health: a Content-Length and no body (RFC 9110 section 9.3.2).
        if urlsplit(self.path).path == "/health":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "11")
            self.end_headers()
        else:
            self._send(404, b"")

    def do_POST(self) -> None:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        body = self._body()
        if parts.path == "/echo":
            self._echo(body)
            return
        if parts.path == "/upload":
            number = _record(
                {"path": parts.path, "bytes": len(body), "key": self.headers.get("Idempotency-Key")}
            )
            digest = hashlib.sha256(body).hexdigest()
            payload = {"id": number, "bytes": len(body), "sha256": digest}
            self._send(201, json.dumps(payload).encode())
            return
        if not (parts.path in ("/orders", "/payments") or parts.path.startswith("/orders/")):
            self._send(404, b'{"error":"not found"}')
            return
        number = _record(
            {
                "path": parts.path,
                "method": self.command,
                "key": self.headers.get("Idempotency-Key"),
                "authorization": self.headers.get("Authorization"),
                "body": body.decode("utf-8", "replace"),
            }
        )
        if query.get("die"):
            os._exit(3)  # the effect happened; the answer never leaves
        time.sleep(int(query.get("delay_ms", "0")) / 1000)
        status = int(query.get("status", "201"))
        if "size" in query:
            self._chunked(status, int(query["size"]), number, cut=bool(query.get("cut")))
            return
        payload = json.dumps({"id": number, "request": body.decode("utf-8", "replace")})
        self._send(status, payload.encode(), {"Location": f"{parts.path}/{number}"})

    do_PATCH = do_POST

    def _chunked(self, status: int, size: int, number: int, *, cut: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Location", f"/orders/{number}")
        self.end_headers()
        block = (b"%08d" % number) * 8192  # 64 KiB per chunk, content tied to the effect
        left = size
        while left > 0:
            piece = block[: min(left, len(block))]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            left -= len(piece)
            if cut and left < size // 2:
                self.wfile.flush()
                os._exit(3)  # the status line and half the body have left
        self.wfile.write(b"0\r\n\r\n")

    def _echo(self, body: bytes) -> None:
        seen = {
            "method": self.command,
            "path": self.path,
            "headers": [[k.lower(), v] for k, v in self.headers.items()],
            "body_bytes": len(body),
        }
        self._send(
            200,
            json.dumps(seen).encode(),
            {
                "Connection": "keep-alive, X-Hop-Secret",
                "X-Hop-Secret": "must not pass",
                "Keep-Alive": "timeout=5",
                "Proxy-Authenticate": "Basic",
                "X-End-To-End": "kept",
            },
        )


def main() -> None:
    global _effects_path
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--effects", required=True)
    args = parser.parse_args()
    _effects_path = args.effects
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"backend on {args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
