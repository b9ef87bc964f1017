"""OrderHub on Flask: ``retrysafe demo --framework flask`` (DESIGN section 5), served by gunicorn
with several worker processes.

Flask's own shape: the views live on a blueprint, :func:`create_app` is the app factory, the
data layer (:class:`~retrysafe.demo._sync_hub.OrderHub`, generated from the async one) sits in
``app.extensions["orderhub"]``, and one error handler turns the domain's problems (and Flask's own
HTTP errors) into ``application/problem+json``. In transactional mode (the orders live in the SQL
store's own database, the default with a SQLite or PostgreSQL store) each record commits with
the stored response; otherwise (Redis) the write path marks the effect committed right after it.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Unpack

from flask import Blueprint, Flask, Response, current_app, jsonify, request
from werkzeug.exceptions import HTTPException

from ..contrib.flask import Idempotency, idempotent
from . import domain
from ._sync_hub import OrderHub
from .charges import WorkerDesk, WorkerLink

__all__ = ["create_app", "orderhub", "serve"]

orderhub = Blueprint("orderhub", __name__)


def _hub() -> OrderHub:
    hub: OrderHub = current_app.extensions["orderhub"]
    return hub


def _problem(problem: domain.Problem) -> Response:
    headers = {**problem.headers(), "Content-Type": "application/problem+json"}
    return Response(problem.body(), problem.status, headers)


@orderhub.get("/")
def index() -> Response:
    """The page."""
    return Response(current_app.config["ORDERHUB_PAGE"], mimetype="text/html")


def _create(kind: domain.Kind) -> tuple[Response, int, dict[str, str]]:
    values = domain.parse_record(kind, request.get_data())
    knobs = domain.Knobs.from_query(request.args.get)
    who = domain.owner(request.headers.get("Authorization"))
    record = _hub().create(kind, values, who, knobs, request.environ)
    return jsonify(record), 201, {"Location": domain.location(kind, record)}


@orderhub.post("/orders")
def create_order() -> tuple[Response, int, dict[str, str]]:
    """``POST /orders``: the key is optional."""
    return _create(domain.ORDERS)


@orderhub.post("/payments")
@idempotent(required=True)
def create_payment() -> tuple[Response, int, dict[str, str]]:
    """``POST /payments``: the key is required. With the worker, the payment is sent to it to
    be charged (once: a replayed answer sends nothing)."""
    created = _create(domain.PAYMENTS)
    desk: WorkerDesk | None = current_app.extensions["orderhub_worker"]
    if desk is not None:
        desk.charge_new(created[0].get_json())
    return created


def _desk() -> WorkerDesk:
    desk: WorkerDesk | None = current_app.extensions["orderhub_worker"]
    if desk is None:
        raise WorkerDesk.missing()
    return desk


@orderhub.get("/charges")
def charges() -> Response:
    """``GET /charges``: each payment's charges and the runs of its charge task."""
    return jsonify(_desk().charges())


@orderhub.post("/payments/<int:record_id>/charge")
def charge_again(record_id: int) -> tuple[Response, int]:
    """``POST /payments/<id>/charge``: send the payment's charge task again."""
    return jsonify(_desk().charge_again(record_id, request.args.get("flow"))), 202


@orderhub.post("/worker/kill")
def kill_worker() -> tuple[Response, int]:
    """``POST /worker/kill``: a worker process SIGKILLed mid-charge."""
    return jsonify(_desk().kill(request.args.get("flow"))), 202


def _listing(kind: domain.Kind) -> Response:
    count, records = _hub().list(kind, domain.parse_limit(request.args.get("limit")))
    return jsonify({"count": count, kind.name: records})


def _detail(kind: domain.Kind, record_id: int) -> Response:
    record = _hub().get(kind, record_id)
    if record is None:
        raise domain.Problem.not_found(kind)
    return jsonify(record)


@orderhub.get("/orders")
def list_orders() -> Response:
    """``GET /orders`` (``?limit=N``: the newest N)."""
    return _listing(domain.ORDERS)


@orderhub.get("/payments")
def list_payments() -> Response:
    """``GET /payments`` (``?limit=N``: the newest N)."""
    return _listing(domain.PAYMENTS)


@orderhub.get("/orders/<int:record_id>")
def get_order(record_id: int) -> Response:
    """``GET /orders/<id>``."""
    return _detail(domain.ORDERS, record_id)


@orderhub.get("/payments/<int:record_id>")
def get_payment(record_id: int) -> Response:
    """``GET /payments/<id>``."""
    return _detail(domain.PAYMENTS, record_id)


@orderhub.post("/reset")
def reset() -> Response:
    """``POST /reset``: delete every order and payment (the page's "Reset demo")."""
    _hub().reset()
    desk: WorkerDesk | None = current_app.extensions["orderhub_worker"]
    if desk is not None:
        desk.reset()
    return Response(status=204)


@orderhub.app_errorhandler(domain.Problem)
@orderhub.app_errorhandler(domain.DemoFailure)
@orderhub.app_errorhandler(domain.DatabaseUnavailable)
def domain_error(exc: Exception) -> Response:
    """The domain's problems, ``?fail=1`` and a busy database."""
    return _problem(domain.problem_of(exc))


@orderhub.app_errorhandler(HTTPException)
def http_error(exc: HTTPException) -> Response:
    """Flask's own errors (404, 405, a body over ``MAX_CONTENT_LENGTH``) as problems too."""
    return _problem(domain.Problem(exc.code or 500, exc.name, exc.description or exc.name))


def create_app(**options: Unpack[domain.OrderHubOptions]) -> Flask:
    """Build OrderHub on Flask (the arguments of every OrderHub's ``create_app``: the fields of
    :class:`~retrysafe.demo.domain.Settings`).

    With ``worker`` (the Celery worker ``retrysafe demo`` starts), each new payment is sent to
    it and ``app.extensions["orderhub_worker"]`` serves the worker's routes.

    Returns:
        The Flask app (``app.extensions["retrysafe"]`` holds the store,
        ``app.extensions["orderhub"]`` the data layer).
    """
    settings = domain.Settings(**options)
    store, db_url, worker = settings.store, settings.db_url, settings.worker
    transactional = settings.in_transaction()
    app = Flask(__name__)
    app.config.update(
        RETRYSAFE_TTL=settings.ttl,
        RETRYSAFE_LEASE=settings.lease,
        ORDERHUB_PAGE=WorkerDesk.page(domain.page(store, db_url), worker is not None),
    )
    Idempotency(app, store=store, transactional=transactional)
    app.extensions["orderhub"] = OrderHub(db_url, transactional=transactional)
    app.extensions["orderhub_worker"] = None if worker is None else WorkerDesk(worker, db_url)
    app.register_blueprint(orderhub)
    return app


def _gunicorn_app(args: argparse.Namespace, worker: WorkerLink | None) -> Any:
    from gunicorn.app.base import BaseApplication

    class OrderHubServer(BaseApplication):  # type: ignore[misc]
        """gunicorn in this process: the master forks the workers; each builds its own app
        (its own store connections and lease renewal thread, never shared across a fork)."""

        def load_config(self) -> None:
            settings = {
                "bind": f"{args.host}:{args.port}",
                # Threads so that a slow request (?delay_ms) does not block its worker process,
                # and the master's heartbeat is not starved by one: gthread workers.
                "worker_class": "gthread",
                "threads": 8,
                "graceful_timeout": 5,
                "loglevel": args.log_level,
                "proc_name": "orderhub-flask",
            }
            if args.store.startswith("memory:"):
                # A memory store lives in one process: several workers would not share it.
                settings["workers"] = 1
            elif "WEB_CONCURRENCY" not in os.environ:  # gunicorn's own override of the count
                settings["workers"] = max(2, min(4, os.cpu_count() or 2))
            for name, value in settings.items():
                self.cfg.set(name, value)

        def load(self) -> Flask:
            return create_app(**domain.options_of(args, worker))

    return OrderHubServer()


def serve(args: argparse.Namespace) -> None:
    """Serve OrderHub on Flask under gunicorn with several worker processes (``WEB_CONCURRENCY``
    sets how many) until interrupted.

    Raises:
        ConfigurationError: a bad store, database or setting (checked before any worker starts).
    """
    # Build the app once here, so a bad URL or setting fails now with its message rather than
    # as a worker that cannot boot. Then drop it: workers must not inherit open connections.
    from .serve import worker, worker_link

    link = worker_link(args)
    probe = create_app(**domain.options_of(args, link))
    probe.extensions["orderhub"].close()
    if link is not None:
        probe.extensions["orderhub_worker"].close()
    Idempotency.state(probe).store.close()
    with worker(args, link):  # the Celery worker beside gunicorn's master, stopped with it
        _gunicorn_app(args, link).run()
