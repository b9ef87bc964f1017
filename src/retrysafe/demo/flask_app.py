"""OrderHub on Flask (DESIGN section 5: the same HTTP contract as the Starlette OrderHub), served
by gunicorn with several worker processes: ``retrysafe demo --framework flask``.

Orders go through ``sqlite3`` or psycopg. In transactional mode (the orders live in the SQL
store's own database, the default with a SQLite or PostgreSQL store) the insert runs on
:func:`retrysafe.contrib.flask.transaction`'s connection and commits together with the stored
response; otherwise (Redis) the view calls :func:`~retrysafe.contrib.flask.mark_committed` right
after the insert.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import threading
import time
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from .._core.errors import ConfigurationError
from ..contrib.flask import Idempotency, idempotent, mark_committed, transaction
from ..stores.sqlite import parse_sqlite_url
from ._contract import DemoFailure, InvalidRecord, knob_ms, parse_record
from .app import DEFAULT_STORE, default_db_url, same_database
from .db import _COLUMNS, _POSTGRES_SCHEMA, _SQLITE_SCHEMA, _insert_sql, _select_sql

__all__ = ["SyncOrderDB", "create_app", "serve"]


class SyncOrderDB:
    """OrderHub's orders and payments for a WSGI server: SQLite (``sqlite3``, one connection per
    thread) or PostgreSQL (a psycopg pool, opened on first use in each worker process).

    Args:
        url: ``sqlite:///path.db`` or ``postgresql://...`` (``?schema=NAME`` keeps the tables
            in that schema).

    Raises:
        ConfigurationError: another scheme, or a bad schema name.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._local = threading.local()
        self._pool: Any = None
        self._lock = threading.Lock()
        if url.startswith("sqlite:///"):
            self.kind = "sqlite"
            self.path, _ = parse_sqlite_url(url)
            self._prefix = ""
            self._mark = "?"
        elif url.startswith(("postgresql://", "postgres://")):
            self.kind = "postgres"
            base, _, query = url.partition("?")
            self._dsn = base
            schema = parse_qs(query).get("schema", [None])[-1]
            if schema is not None and not schema.replace("_", "").isalnum():
                raise ConfigurationError(f"invalid schema name {schema!r}")
            self._schema = schema
            # Qualified names: in transactional mode the insert runs on the store's connection.
            self._prefix = f'"{schema}".' if schema else ""
            self._mark = "$"
        else:
            raise ConfigurationError(
                f"OrderHub keeps its data in SQLite (sqlite:///...) or PostgreSQL, got {url!r}"
            )

    def _table(self, kind: str) -> str:
        return f"{self._prefix}orderhub_{kind}"

    def _marks(self, count: int) -> list[str]:
        return ["?"] * count if self._mark == "?" else [f"${i + 1}" for i in range(count)]

    def _sqlite(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout = 5000")  # a blocking wait is fine on a thread
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.executescript(_SQLITE_SCHEMA)
            self._local.conn = conn
        return conn

    def _postgres(self) -> Any:
        with self._lock:
            if self._pool is None:
                import psycopg
                from psycopg_pool import ConnectionPool

                kwargs: dict[str, Any] = {"autocommit": True, "cursor_factory": psycopg.RawCursor}
                with psycopg.connect(self._dsn, **kwargs) as conn:
                    if self._schema:
                        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self._schema}"')
                    with conn.transaction():  # several workers start at once: one DDL at a time
                        conn.execute("SELECT pg_advisory_xact_lock(7206110)")
                        conn.execute(
                            _POSTGRES_SCHEMA.replace("orderhub_", self._prefix + "orderhub_")
                        )
                pool: Any = ConnectionPool(
                    self._dsn, kwargs=kwargs, min_size=1, max_size=8, open=False
                )
                pool.open(wait=True, timeout=10)
                self._pool = pool
            return self._pool

    def _execute(self, sql: str, params: tuple[Any, ...], conn: Any, fetch: str) -> Any:
        if conn is None and self.kind == "postgres":
            with self._postgres().connection() as own:
                return _fetch(own.execute(sql, params), fetch)
        return _fetch((conn or self._sqlite()).execute(sql, params), fetch)

    def setup(self) -> None:
        """Create the tables now (at start-up, not inside a request's transaction)."""
        self._sqlite() if self.kind == "sqlite" else self._postgres()

    def add(self, kind: str, owner: str, conn: Any = None, **values: Any) -> dict[str, Any]:
        """Insert an order or payment (in ``conn``'s transaction when given) and return it."""
        names = ("owner", *values)
        sql = _insert_sql(self._table(kind), kind, names, self._marks(len(names)))
        row = self._execute(sql, (owner, *values.values()), conn, "one")
        return dict(zip(_COLUMNS[kind], row, strict=True))

    def list(self, kind: str, limit: int | None = None) -> tuple[int, list[dict[str, Any]]]:
        """Return (total count, records newest first, at most ``limit``)."""
        (count,) = self._execute(f"SELECT count(*) FROM {self._table(kind)}", (), None, "one")
        sql = _select_sql(self._table(kind), kind) + " ORDER BY id DESC"
        params: tuple[int, ...] = ()
        if limit is not None:
            sql += f" LIMIT {self._marks(1)[0]}"
            params = (limit,)
        rows = self._execute(sql, params, None, "all")
        return int(count), [dict(zip(_COLUMNS[kind], r, strict=True)) for r in rows]

    def get(self, kind: str, record_id: int) -> dict[str, Any] | None:
        """Return one record or ``None``."""
        sql = _select_sql(self._table(kind), kind) + f" WHERE id = {self._marks(1)[0]}"
        row = self._execute(sql, (record_id,), None, "one")
        return None if row is None else dict(zip(_COLUMNS[kind], row, strict=True))

    def reset(self) -> None:
        """Delete every order and payment."""
        for kind in _COLUMNS:
            self._execute(f"DELETE FROM {self._table(kind)}", (), None, "none")

    def close(self) -> None:
        """Close this thread's SQLite connection or the pool."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


def _fetch(cursor: Any, fetch: str) -> Any:
    if fetch == "one":
        return cursor.fetchone()
    return cursor.fetchall() if fetch == "all" else None


def _problem(status: int, title: str, detail: str) -> Response:
    body = {"type": "urn:orderhub:problem:invalid-request", "title": title, "status": status}
    body["detail"] = detail
    return Response(json.dumps(body), status, mimetype="application/problem+json")


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(data), status, headers, mimetype="application/json")


def _owner() -> str:
    scheme, _, name = request.headers.get("Authorization", "").partition(" ")
    return name.strip() if scheme.lower() == "bearer" and name.strip() else "anonymous"


def _int_param(name: str) -> int:
    return knob_ms(request.args.get(name))


def _create(kind: str, fields: dict[str, type], db: SyncOrderDB, transactional: bool) -> Response:
    try:
        values = parse_record(request.get_data(), kind, fields)
    except InvalidRecord as bad:
        return _problem(bad.status, bad.title, bad.detail)
    delay_ms = _int_param("delay_ms")
    if delay_ms:
        time.sleep(delay_ms / 1000)
    if request.args.get("fail") == "1":
        raise DemoFailure(f"the {kind} handler failed on purpose (?fail=1)")
    if transactional:
        # The order commits together with the stored response (exactly once, even on a crash).
        record = db.add(kind, _owner(), conn=transaction(optional=True), **values)
    else:
        record = db.add(kind, _owner(), **values)
        # From here a crash must not lead to a second order: retries get "outcome unknown".
        mark_committed()
    delay_after_ms = _int_param("delay_after_ms")
    if delay_after_ms:
        time.sleep(delay_after_ms / 1000)
    return _json(record, 201, {"Location": f"/{kind}/{record['id']}"})


def create_app(
    *,
    store: str = DEFAULT_STORE,
    db: str | None = None,
    ttl: float = 24 * 3600.0,
    lease: float = 30.0,
    transactional: bool | None = None,
) -> Flask:
    """Build OrderHub on Flask.

    Args:
        store: the idempotency store URL.
        db: where orders and payments live (default: the store's database when it is SQL).
        ttl: retention of completed records, seconds.
        lease: lease of in-progress records, seconds.
        transactional: commit orders together with the stored responses; by default on when
            the orders live in the store's own SQL database.

    Returns:
        The Flask app (``app.extensions["retrysafe"]`` holds the store).
    """
    db_url = db or default_db_url(store)
    database = SyncOrderDB(db_url)
    if transactional is None:
        transactional = same_database(store, db_url)
    app = Flask(__name__)
    app.config.update(RETRYSAFE_TTL=ttl, RETRYSAFE_LEASE=lease)
    Idempotency(app, store=store, transactional=transactional)
    app.extensions["orderhub_db"] = database
    page = resources.files("retrysafe.demo").joinpath("static", "index.html").read_bytes()

    @app.get("/")
    def index() -> Response:
        return Response(page, mimetype="text/html")

    @app.post("/orders")
    def create_order() -> Response:
        return _create("orders", {"item": str, "quantity": int}, database, transactional)

    @app.post("/payments")
    @idempotent(required=True)
    def create_payment() -> Response:
        return _create("payments", {"amount": int, "currency": str}, database, transactional)

    def listing(kind: str) -> Response:
        limit: int | None = None
        if "limit" in request.args:
            try:
                limit = max(0, int(request.args["limit"]))
            except ValueError:
                return _problem(400, "Bad limit", "limit must be an integer.")
        count, records = database.list(kind, limit)
        return _json({"count": count, kind: records})

    def detail(kind: str, record_id: int) -> Response:
        record = database.get(kind, record_id)
        if record is None:
            return _problem(404, "Not found", f"No such {kind[:-1]}.")
        return _json(record)

    app.add_url_rule("/orders", "list_orders", lambda: listing("orders"), methods=["GET"])
    app.add_url_rule("/payments", "list_payments", lambda: listing("payments"), methods=["GET"])
    app.add_url_rule(
        "/orders/<int:record_id>", "order", lambda record_id: detail("orders", record_id)
    )
    app.add_url_rule(
        "/payments/<int:record_id>", "payment", lambda record_id: detail("payments", record_id)
    )

    @app.post("/reset")
    def reset() -> Response:
        database.reset()
        return Response(status=204)

    @app.errorhandler(DemoFailure)
    def failed(exc: DemoFailure) -> Response:
        return _problem(500, "Handler failed", str(exc))

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        # Flask's own errors (404, 405, a body over MAX_CONTENT_LENGTH) as problem+json too.
        status = exc.code or 500
        return _problem(status, exc.name, exc.description or exc.name)

    database.setup()
    return app


def _gunicorn_app(args: argparse.Namespace) -> Any:
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
            return create_app(store=args.store, db=args.db, ttl=args.ttl, lease=args.lease)

    return OrderHubServer()


def serve(args: argparse.Namespace) -> None:
    """Serve OrderHub on Flask under gunicorn with several worker processes (``WEB_CONCURRENCY``
    sets how many) until interrupted.

    Raises:
        ConfigurationError: a bad store, database or setting (checked before any worker starts).
    """
    # Build the app once here, so a bad URL or setting fails now with its message rather than
    # as a worker that cannot boot. Then drop it: workers must not inherit open connections.
    probe = create_app(store=args.store, db=args.db, ttl=args.ttl, lease=args.lease)
    probe.extensions["orderhub_db"].close()
    Idempotency.state(probe).store.close()
    _gunicorn_app(args).run()
