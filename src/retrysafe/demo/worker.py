"""OrderHub's Celery worker: the task that charges a payment, with retrysafe and without.

``retrysafe demo`` runs it as a child process
(:func:`~retrysafe.demo.charges.worker_command`)::

    celery -A retrysafe.demo.worker worker --pool prefork

configured by the environment it sets (:func:`~retrysafe.demo.charges.worker_environment`): the
broker, the store and the database of the web app beside it. Every payment the web app creates is
sent to ``orderhub.charge``: ``@app.task(acks_late=True, reject_on_worker_lost=True)`` over
``@idempotent_task(key="payment_id")``, whose effect (a row in ``orderhub_charges``) commits in
the task's idempotent transaction when the store is SQL and keeps its records in the demo's
database, else is followed by ``mark_committed()``. ``orderhub.charge_plain`` is the same task
without retrysafe: the control. Each delivery of either leaves a row in
``orderhub_charge_runs`` (:class:`~retrysafe.demo.charges.ChargeBook`).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from celery import Celery, signals

from ..contrib.celery import idempotent_task
from ..functions import mark_committed, transaction
from .charges import CHARGE_TASKS, DEFAULT_BROKER, ENV, ChargeBook, broker_options
from .domain import DEFAULT_STORE, default_db_url, same_database

__all__ = ["app", "charge", "charge_plain"]

BROKER = os.environ.get(f"{ENV}BROKER", DEFAULT_BROKER)
STORE = os.environ.get(f"{ENV}STORE", DEFAULT_STORE)
DB = os.environ.get(f"{ENV}DB") or default_db_url(STORE)
#: The task's writes commit with its record when they share the store's SQL database.
TRANSACTIONAL = same_database(STORE, DB)

_url, _options = broker_options(BROKER)
app = Celery("orderhub", broker=_url)
app.conf.update(
    broker_transport_options=_options,
    broker_connection_retry_on_startup=True,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    worker_enable_remote_control=not _url.startswith("filesystem"),
    worker_hijack_root_logger=False,
    # A killed pool process's task goes back to the queue at once (default: after 10 s).
    worker_lost_wait=1.0,
)

_books: dict[int, ChargeBook] = {}


def _book() -> ChargeBook:
    """This process's :class:`ChargeBook` (never one inherited across the prefork fork)."""
    book = _books.get(os.getpid())
    if book is None:
        book = _books[os.getpid()] = ChargeBook(DB)
    return book


_delivery = threading.local()


def _on_event(event: str, details: dict[str, Any]) -> None:
    if event in ("executed", "replayed"):
        _delivery.event = event


def _task_id() -> str:
    from celery import current_task

    return str(current_task.request.id)


@app.task(name=CHARGE_TASKS["retrysafe"], acks_late=True, reject_on_worker_lost=True)
@idempotent_task(
    store=STORE,
    key="payment_id",
    fingerprint=["payment_id", "amount", "currency"],
    name="orderhub.charge",
    transactional=TRANSACTIONAL,
    ttl=float(os.environ.get(f"{ENV}TTL", 24 * 3600)),
    lease=float(os.environ.get(f"{ENV}LEASE", 30)),
    on_event=_on_event,
)
def charge(payment_id: int, amount: int, currency: str, hold_ms: int = 0) -> dict[str, Any]:
    """Charge a payment once, however often it is delivered: the charge row commits with the
    task's record (or is marked committed), then ``hold_ms`` passes before the task ends."""
    conn = transaction() if TRANSACTIONAL else None
    charge_id = _book().charge("retrysafe", payment_id, amount, currency, _task_id(), conn=conn)
    if conn is None:
        mark_committed()  # from here a killed run is "outcome unknown", never a second charge
    time.sleep(hold_ms / 1000)
    return {"charge_id": charge_id, "payment_id": payment_id}


@app.task(name=CHARGE_TASKS["plain"], acks_late=True, reject_on_worker_lost=True)
def charge_plain(payment_id: int, amount: int, currency: str, hold_ms: int = 0) -> dict[str, Any]:
    """The same charge without retrysafe: every delivery that runs writes a charge."""
    charge_id = _book().charge("plain", payment_id, amount, currency, _task_id(), conn=None)
    time.sleep(hold_ms / 1000)
    return {"charge_id": charge_id, "payment_id": payment_id}


_FLOW_OF = {name: flow for flow, name in CHARGE_TASKS.items()}


@signals.task_prerun.connect
def _run_started(task_id: str = "", task: Any = None, args: Any = (), **_: Any) -> None:
    flow = _FLOW_OF.get(getattr(task, "name", ""))
    if flow is None:
        return
    _delivery.event = None
    _delivery.run = _book().start_run(flow, int(args[0]), task_id, os.getpid())


@signals.task_postrun.connect
def _run_ended(task: Any = None, state: str = "", retval: Any = None, **_: Any) -> None:
    run = getattr(_delivery, "run", None)
    if run is None or _FLOW_OF.get(getattr(task, "name", "")) is None:
        return
    _delivery.run = None
    if state == "SUCCESS":
        replayed = getattr(_delivery, "event", None) == "replayed"
        outcome = "answered from the stored result" if replayed else "charged"
    elif state == "RETRY":
        outcome = "retried later (another worker runs it)"
    else:
        outcome = f"failed: {type(retval).__name__}"
    _book().end_run(run, outcome)


@signals.worker_init.connect
def _follow_parent(**_: Any) -> None:
    """Stop this worker when ``retrysafe demo`` is gone (killed without a chance to stop it)."""
    parent = int(os.environ.get(f"{ENV}PARENT", "0"))
    if not parent:
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="orderhub-parent", daemon=True).start()
