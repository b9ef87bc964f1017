"""The ``flask`` shell of the wire-contract suite: the orders app as Flask views, protected by
:class:`retrysafe.contrib.flask.Idempotency`, driven through Flask's own test client.

The views behave as the WSGI harness app does (the same :func:`~.harness.plan`, the same knobs,
the same response iterable, whose ``close()`` calls are counted), so every contract test reads
the same on this shell. Requests come from the harness as ``httpx.Request`` objects (so every
shell gets the same header set and body) and go through ``app.test_client().open``; responses
come back as ``httpx.Response`` objects with the test client's status, every header field (in
order, repeated ones included) and body.

Where the test client differs from a production server, it differs as Werkzeug's test client
does (these are the environs Flask users test with): repeated request header fields are joined
with ``", "``, and a percent-escape that is not UTF-8 in the path arrives as U+FFFD.
"""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import httpx
from flask import Flask, Response, request
from flask.testing import FlaskClient
from werkzeug.datastructures import Headers
from werkzeug.test import EnvironBuilder, TestResponse

from retrysafe.contrib.flask import Idempotency, mark_committed

from .harness import CutStream, HandlerFailed, World, WsgiChunks, plan

__all__ = ["FlaskFront", "flask_app"]

METHODS = ["GET", "POST", "PATCH", "PUT"]
BASE_URL = "http://test"


def flask_app(world: World) -> Flask:
    """The orders app as a Flask app (one view for every path)."""
    app = Flask("contract")

    @app.route("/", defaults={"rest": ""}, methods=METHODS)
    @app.route("/<path:rest>", methods=METHODS)
    def orders(rest: str) -> Response:
        body = request.get_data()
        headers = {name.lower(): value for name, value in request.headers.items()}
        p = plan(world, request.path, request.environ.get("QUERY_STRING", ""), body, headers)
        if p.mark:
            world.marks.append(mark_committed())
        if p.hold:
            world.held(p.run)
        if p.sleep:
            time.sleep(p.sleep)
        if p.fail:
            raise HandlerFailed("the handler failed")  # Flask answers 500 (not in testing mode)
        response = Response(WsgiChunks(world, p.chunks, p.midway), status=p.status)
        # Every header as planned and nothing more (no default Content-Type on a 204).
        response.headers = Headers(p.headers)
        return response

    return app


class FlaskFront:
    """One Flask app behind the extension, and the test clients that drive it (one per thread:
    the harness sends concurrent requests from threads, as a threaded server would serve them).

    Args:
        store: the sync store, passed to :class:`Idempotency` as an object.
        world: the effects it shares with other instances.
        **options: fields of :class:`retrysafe.IdempotencyConfig`, as extension options.
    """

    def __init__(self, store: Any, world: World, **options: Any) -> None:
        self.app = flask_app(world)
        self.extension = Idempotency(self.app, store=store, **options)
        self.middleware = Idempotency.state(self.app).middleware
        self._local = threading.local()

    def _client(self) -> FlaskClient:
        client: FlaskClient | None = getattr(self._local, "client", None)
        if client is None:
            # No cookie jar: every request carries exactly the headers the harness built.
            client = self.app.test_client(use_cookies=False)
            self._local.client = client
        return client

    def _open(self, request: httpx.Request) -> TestResponse:
        """``client.open(..., buffered=False)`` for the httpx request: the head is in, the
        body is the app's iterable, not yet read."""
        request.read()
        path = request.url.raw_path.split(b"?")[0].decode("ascii")
        query = request.url.query.decode("ascii")
        # Host comes from base_url (as a server's HTTP_HOST); every other field as sent.
        headers = [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in request.headers.raw
            if name.lower() != b"host"
        ]
        client = self._client()
        if "chunked" not in request.headers.get("transfer-encoding", ""):
            return client.open(
                path,
                base_url=BASE_URL,
                method=request.method,
                query_string=query,
                headers=headers,
                data=request.content,
                buffered=False,
            )
        # A chunked body has no Content-Length, which EnvironBuilder always sets for an input
        # stream: build the environ, then make it what gunicorn gives (no CONTENT_LENGTH, the
        # stream ends at the body's end) and open the test client with that request.
        builder = EnvironBuilder(
            path,
            base_url=BASE_URL,
            method=request.method,
            query_string=query,
            headers=headers,
            input_stream=io.BytesIO(request.content),
        )
        environ = builder.get_environ()
        del environ["CONTENT_LENGTH"]
        environ["wsgi.input_terminated"] = True
        return client.open(self.app.request_class(environ), buffered=False)

    def send(self, request: httpx.Request) -> httpx.Response:
        """Send one request and read its whole response, as a server and its client do: an
        exception before the head is a plain 500, one in mid-body a cut connection."""
        try:
            response = self._open(request)
        except Exception:
            return httpx.Response(500, content=b"Internal Server Error", request=request)
        try:
            body = b"".join(response.response)
        except Exception as exc:
            raise httpx.RemoteProtocolError("the body ended early", request=request) from exc
        finally:
            response.close()
        raw = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in response.headers.items()]
        return httpx.Response(response.status_code, headers=raw, content=body, request=request)

    def abandon(self, request: httpx.Request, after: int) -> None:
        """The client goes away after reading ``after`` body chunks: the test client's response
        is closed early (the head is always in: the test client needs it to return)."""
        response = self._open(request)
        chunks = iter(response.response)
        for _ in range(after):
            next(chunks, None)
        response.close()

    def cut(self, request: httpx.Request, sent: int, error: bool) -> int | None:
        """The client leaves after ``sent`` bytes of the body: the environ's stream ends there
        (or fails), its ``Content-Length`` still the whole body's."""
        request.read()
        builder = EnvironBuilder(
            request.url.raw_path.split(b"?")[0].decode("ascii"),
            base_url=BASE_URL,
            method=request.method,
            query_string=request.url.query.decode("ascii"),
            headers=[
                (name.decode("latin-1"), value.decode("latin-1"))
                for name, value in request.headers.raw
                if name.lower() != b"host"
            ],
        )
        environ = builder.get_environ()
        environ["wsgi.input"] = CutStream(request.content[:sent], error=error)
        environ["CONTENT_LENGTH"] = str(len(request.content))
        response = self._client().open(self.app.request_class(environ), buffered=False)
        response.close()
        return response.status_code

    def close(self) -> None:
        """Nothing to release here: the harness closes the store."""
