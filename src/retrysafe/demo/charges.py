"""OrderHub's worker side, without Celery: where charges and their task runs live, the broker,
and what the page reads (``GET /charges``) and does (``POST /payments/<id>/charge``,
``POST /worker/kill``).

Creating a payment enqueues a Celery task that charges it (:mod:`retrysafe.demo.worker`, run by
the ``celery worker`` that ``retrysafe demo`` starts beside the web app). Its effect is a row in
``orderhub_charges``; every delivery of the task leaves a row in ``orderhub_charge_runs``
(``running``, then ``charged``, ``answered from the stored result``, ``retried later``,
``failed: ...`` or ``killed``), so the page shows counts read from the database, never a story.
Two flows charge the same way: ``retrysafe`` (the task under
:func:`~retrysafe.contrib.celery.idempotent_task`, keyed by the payment id) and ``plain`` (the
same task without it: the control).

This module imports no framework and no Celery: the web app calls it from a thread
(:func:`asyncio.to_thread`), the worker directly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import ConfigurationError
from ._drivers import Psycopg, PyMySQL, SyncSQLite, open_driver, record
from .domain import PAYMENTS, Problem, default_db_url, shown_url

__all__ = [
    "CHARGE_TASKS",
    "DEFAULT_BROKER",
    "ENV",
    "FLOWS",
    "HOLD_MS",
    "ChargeBook",
    "WorkerDesk",
    "WorkerLink",
    "broker_options",
    "kill_mid_charge",
    "run_worker",
    "worker_command",
    "worker_environment",
]

#: The broker of ``retrysafe demo`` without ``--broker``: kombu's file-system transport in a
#: folder beside the demo's database (no server to install).
DEFAULT_BROKER = "filesystem://./retrysafe-demo-broker"

#: The two ways the worker charges a payment, and the Celery task of each.
CHARGE_TASKS = {"retrysafe": "orderhub.charge", "plain": "orderhub.charge_plain"}
FLOWS = tuple(CHARGE_TASKS)

#: How long a charge of the kill demonstration holds after writing its charge (ms): the window
#: in which ``POST /worker/kill`` kills the worker process that runs it.
HOLD_MS = 2500

#: The outcome of a run whose process is still at it.
RUNNING = "running"

#: The prefix of the environment variables that configure the worker child.
ENV = "RETRYSAFE_DEMO_"


def broker_options(url: str) -> tuple[str, dict[str, Any]]:
    """A ``--broker`` URL as Celery's ``broker_url`` and ``broker_transport_options``.

    ``filesystem://FOLDER`` is kombu's file-system transport in ``FOLDER`` (relative to the
    working directory, created here); any other URL (``redis://``, ``amqp://``...) is passed on.
    """
    if not url.startswith("filesystem://"):
        return url, {}
    folder = Path(url[len("filesystem://") :] or "retrysafe-demo-broker").resolve()
    (folder / "queue").mkdir(parents=True, exist_ok=True)
    (folder / "control").mkdir(parents=True, exist_ok=True)
    options = {
        "data_folder_in": str(folder / "queue"),
        "data_folder_out": str(folder / "queue"),
        "control_folder": str(folder / "control"),
        "polling_interval": 0.1,
    }
    return "filesystem://", options


@dataclass
class WorkerLink:
    """How the web app reaches the worker: the broker, and the worker's main process (so that
    ``POST /worker/kill`` kills only a process of this demo's own worker).

    Attributes:
        broker: the ``--broker`` URL.
        worker_pid: the ``celery worker`` main process that ``retrysafe demo`` started
            (``None``: a worker started elsewhere; the kill button is refused).
    """

    broker: str
    worker_pid: int | None = None
    _app: Any = field(default=None, repr=False)

    def send(self, flow: str, payment: dict[str, Any], hold_ms: int = 0) -> str:
        """Enqueue the charge of ``payment`` on ``flow``; return the task's id."""
        if self._app is None:
            from celery import Celery

            url, options = broker_options(self.broker)
            app = Celery("orderhub", broker=url, set_as_current=False)
            app.conf.broker_transport_options = options
            self._app = app
        args = (payment["id"], payment["amount"], payment["currency"], hold_ms)
        result = self._app.send_task(CHARGE_TASKS[flow], args=args, ignore_result=True)
        return str(result.id)


class ChargeBook:
    """The charges and runs tables of the OrderHub database (``--db``), sync (a thread per call
    in the web app; the worker's own process).

    Args:
        db_url: the same ``--db`` as the web app's.
    """

    def __init__(self, db_url: str) -> None:
        self.url = db_url
        self._driver: SyncSQLite | Psycopg | PyMySQL = open_driver(db_url)
        sql = self._driver.sql
        self._prefix = sql.prefix
        self._marks = [
            "%s" if sql.mysql else f"${i + 1}" if sql.numbered else "?" for i in range(6)
        ]

    def _sql(self, text: str) -> str:
        """``text`` with ``{p}`` the table prefix and ``{1}``... the dialect's placeholders."""
        return text.format(*["", *self._marks], p=self._prefix)

    def run(self, text: str, params: Sequence[Any] = (), *, conn: Any = None) -> Any:
        """Run one statement of this module's SQL (``{p}``, ``{1}``...)."""
        return self._driver.run(self._sql(text), params, conn=conn, write=True)

    # -- the worker's writes ---------------------------------------------------------------

    def _insert(self, table: str, values: Sequence[Any], *, conn: Any = None) -> int:
        """Insert one row of ``orderhub_<table>`` (``values`` in its columns' order); return its
        id (on MySQL, which has no ``RETURNING``, read back by ``LAST_INSERT_ID()``)."""
        rows = self._driver.run(self._driver.sql.insert_id(table), values, conn=conn, write=True)
        return int(rows[0][0])

    def charge(
        self, flow: str, payment_id: int, amount: int, currency: str, task_id: str, *, conn: Any
    ) -> int:
        """Write one charge (the task's effect); return its id. With ``conn`` (the task's
        idempotent transaction) it commits together with the task's stored result."""
        return self._insert("charges", (payment_id, flow, amount, currency, task_id), conn=conn)

    def start_run(self, flow: str, payment_id: int, task_id: str, pid: int) -> int:
        """Record that a delivery of a charge task started in process ``pid``."""
        return self._insert("charge_runs", (payment_id, flow, task_id, pid, RUNNING))

    def end_run(self, run_id: int, outcome: str) -> None:
        """Record how a delivery ended (only a run still ``running``: a kill is never
        overwritten)."""
        self.run(
            "UPDATE {p}orderhub_charge_runs SET outcome = {1} WHERE id = {2} AND outcome = {3}",
            (outcome, run_id, RUNNING),
        )

    # -- what the web app does -----------------------------------------------------------

    def new_payment(self, owner: str, amount: int, currency: str) -> dict[str, Any]:
        """Write a payment outside any request (the kill demonstration's own payment)."""
        sql = self._driver.sql
        rows = self._driver.run(sql.insert(PAYMENTS), (owner, amount, currency), write=True)
        return record(PAYMENTS, rows[0])

    def payment(self, payment_id: int) -> dict[str, Any] | None:
        """One payment, or ``None``."""
        if not 1 <= payment_id <= 2**63 - 1:
            return None
        rows = self._driver.run(self._driver.sql.by_id(PAYMENTS), (payment_id,))
        return record(PAYMENTS, rows[0]) if rows else None

    def running(self, payment_id: int, flow: str) -> tuple[int, int] | None:
        """(run id, pid) of a delivery of this payment's charge that runs now, if any."""
        rows = self.run(
            "SELECT id, pid FROM {p}orderhub_charge_runs "
            "WHERE payment_id = {1} AND flow = {2} AND outcome = {3} ORDER BY id DESC",
            (payment_id, flow, RUNNING),
        )
        return (int(rows[0][0]), int(rows[0][1])) if rows else None

    def mark_killed(self, run_id: int) -> None:
        """Record that this run's process was SIGKILLed."""
        self.run(
            "UPDATE {p}orderhub_charge_runs SET outcome = 'killed (SIGKILL)' WHERE id = {1}",
            (run_id,),
        )

    def summary(self, limit: int = 20) -> dict[str, Any]:
        """What ``GET /charges`` answers: totals per flow, and the newest ``limit`` payments
        with a charge task (their charges counted, every run)."""
        totals = {flow: {"payments": 0, "charges": 0} for flow in FLOWS}
        counted = self.run(
            "SELECT flow, count(DISTINCT payment_id), count(*) FROM {p}orderhub_charges "
            "GROUP BY flow"
        )
        for flow, paid, charges in counted:
            totals[flow] = {"payments": int(paid), "charges": int(charges)}
        newest = self.run(
            "SELECT payment_id, flow, max(id) FROM {p}orderhub_charge_runs "
            "GROUP BY payment_id, flow ORDER BY max(id) DESC LIMIT {1}",
            (limit,),
        )
        shown: list[dict[str, Any]] = []
        for payment_id, flow, _ in newest:
            [(charges,)] = self.run(
                "SELECT count(*) FROM {p}orderhub_charges WHERE payment_id = {1} AND flow = {2}",
                (payment_id, flow),
            )
            runs = self.run(
                "SELECT task_id, pid, outcome, started_at FROM {p}orderhub_charge_runs "
                "WHERE payment_id = {1} AND flow = {2} ORDER BY id",
                (payment_id, flow),
            )
            shown.append(
                {
                    "payment_id": int(payment_id),
                    "flow": flow,
                    "charges": int(charges),
                    "runs": [
                        {"task_id": t, "pid": int(pid), "outcome": o, "started_at": s}
                        for t, pid, o, s in runs
                    ],
                }
            )
        return {"totals": totals, "payments": shown}

    def reset(self) -> None:
        """Delete every charge and run."""
        self.run("DELETE FROM {p}orderhub_charges")
        self.run("DELETE FROM {p}orderhub_charge_runs")

    def close(self) -> None:
        """Release the database connections."""
        self._driver.close()


class WorkerDesk:
    """What every OrderHub front does with its worker, framework-free (sync: the ASGI apps call
    it from a thread): each method is one route's work, its bad input a domain
    :class:`~retrysafe.demo.domain.Problem`.

    Args:
        link: the broker and the worker process.
        db_url: the OrderHub database (``--db``).
    """

    def __init__(self, link: WorkerLink, db_url: str) -> None:
        self.link = link
        self.book = ChargeBook(db_url)

    @staticmethod
    def flow(raw: str | None) -> str:
        """``?flow=`` (default ``retrysafe``).

        Raises:
            Problem: ``400``, not a flow.
        """
        flow = raw or "retrysafe"
        if flow not in FLOWS:
            raise Problem.bad_query("flow", f"flow must be one of {', '.join(FLOWS)}.")
        return flow

    def charge_new(self, payment: dict[str, Any]) -> None:
        """Send a payment just created to be charged (the retrysafe task)."""
        self.link.send("retrysafe", payment)

    def charges(self) -> dict[str, Any]:
        """``GET /charges``: totals, and each payment's charges and task runs (from the
        database), the broker (its password hidden) and the worker's process."""
        summary = self.book.summary()
        return {
            "broker": shown_url(self.link.broker),
            "worker_pid": self.link.worker_pid,
            **summary,
        }

    def charge_again(self, payment_id: int, flow: str | None) -> dict[str, Any]:
        """``POST /payments/<id>/charge``: send the payment's charge task again.

        Raises:
            Problem: ``400`` a bad flow; ``404`` no such payment.
        """
        chosen = self.flow(flow)
        payment = self.book.payment(payment_id)
        if payment is None:
            raise Problem.not_found(PAYMENTS)
        task_id = self.link.send(chosen, payment)
        return {"payment_id": payment["id"], "flow": chosen, "task_id": task_id}

    def kill(self, flow: str | None) -> dict[str, Any]:
        """``POST /worker/kill``: :func:`kill_mid_charge`.

        Raises:
            Problem: ``400`` a bad flow; ``409`` nothing to kill.
        """
        chosen = self.flow(flow)
        try:
            return kill_mid_charge(self.book, self.link, chosen)
        except ConfigurationError as exc:
            raise Problem(409, "Cannot kill the worker", str(exc), slug="no-worker") from exc

    def reset(self) -> None:
        """Delete every charge and run."""
        self.book.reset()

    def close(self) -> None:
        """Release the database connections."""
        self.book.close()

    @staticmethod
    def missing() -> Problem:
        """The answer of a worker route when this OrderHub runs without its worker (``404``)."""
        return Problem(
            404, "No worker", "This OrderHub runs without its Celery worker.", slug="not-found"
        )

    @staticmethod
    def page(page: bytes, worker: bool) -> bytes:
        """The page, its worker panel on when there is a worker."""
        return page.replace(b'data-worker="off"', b'data-worker="on"', 1) if worker else page


def kill_mid_charge(
    book: ChargeBook, link: WorkerLink, flow: str, *, timeout: float = 15.0
) -> dict[str, Any]:
    """The page's "kill the worker mid-charge": a new payment whose charge (on ``flow``) holds
    :data:`HOLD_MS` after writing its charge; the worker process running it is SIGKILLed in
    that window. Celery's prefork worker starts a new process and, with ``acks_late`` and
    ``task_reject_on_worker_lost``, delivers the task again.

    Returns:
        ``{"payment_id", "flow", "task_id", "killed_pid"}``.

    Raises:
        ConfigurationError: the worker was not started by this demo, or never ran the charge.
    """
    if link.worker_pid is None:
        raise ConfigurationError("the worker was not started by retrysafe demo: nothing to kill")
    payment = book.new_payment("worker-demo", 10, "EUR")
    task_id = link.send(flow, payment, hold_ms=HOLD_MS)
    deadline = time.monotonic() + timeout
    while (found := book.running(payment["id"], flow)) is None:
        if time.monotonic() > deadline:
            raise ConfigurationError(f"the worker did not start the charge within {timeout:g} s")
        time.sleep(0.05)
    run_id, pid = found
    if not _child_of(pid, link.worker_pid):
        raise ConfigurationError(f"process {pid} is not a process of this demo's worker")
    time.sleep(HOLD_MS / 1000 / 3)  # well inside the hold: the charge is written, not acked
    os.kill(pid, signal.SIGKILL)
    book.mark_killed(run_id)
    return {"payment_id": payment["id"], "flow": flow, "task_id": task_id, "killed_pid": pid}


def _child_of(pid: int, parent: int) -> bool:
    """Whether ``pid`` is a child of ``parent`` (where ``/proc`` tells; elsewhere, trusted)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return not Path("/proc/self").exists()
    return int(stat.rsplit(")", 1)[1].split()[1]) == parent


def worker_environment(
    *, broker: str, store: str, db: str | None, ttl: float, lease: float
) -> dict[str, str]:
    """The environment of the worker child: the web app's broker, store and database."""
    return {
        f"{ENV}BROKER": broker,
        f"{ENV}STORE": store,
        f"{ENV}DB": db or default_db_url(store),
        f"{ENV}TTL": str(ttl),
        f"{ENV}LEASE": str(lease),
        f"{ENV}PARENT": str(os.getpid()),
    }


def worker_command(concurrency: int = 2) -> list[str]:
    """The ``celery worker`` command line of the demo's worker: prefork, ``concurrency``
    processes (the app sets ``acks_late`` and ``task_reject_on_worker_lost``)."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "retrysafe.demo.worker",
        "worker",
        "--pool",
        "prefork",
        "--concurrency",
        str(concurrency),
        "--loglevel",
        "INFO",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "--hostname",
        f"orderhub-{os.getpid()}@%h",
    ]


@contextmanager
def run_worker(
    link: WorkerLink, *, store: str, db: str | None, ttl: float, lease: float
) -> Iterator[None]:
    """Run the demo's ``celery worker`` as a child process while the block runs (the web app
    serves in it), then stop it: SIGTERM (Celery's warm shutdown), SIGKILL after 10 s.
    ``link.worker_pid`` is its main process meanwhile.

    Ctrl-C in a terminal reaches both processes; the worker also stops by itself when its
    parent is gone (:mod:`retrysafe.demo.worker` watches it).
    """
    settings = worker_environment(broker=link.broker, store=store, db=db, ttl=ttl, lease=lease)
    proc = subprocess.Popen(worker_command(), env={**os.environ, **settings})
    link.worker_pid = proc.pid
    try:
        yield
    finally:
        link.worker_pid = None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
