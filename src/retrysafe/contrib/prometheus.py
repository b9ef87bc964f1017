"""Prometheus metrics for retrysafe (``pip install 'retrysafe[prometheus]'``).

::

    from retrysafe.asgi import IdempotencyMiddleware
    from retrysafe.contrib.prometheus import PrometheusMetrics, metrics_response

    metrics = PrometheusMetrics()           # once per process (it registers the metrics)
    app = IdempotencyMiddleware(app, **metrics.wire("redis://127.0.0.1:6379/0"))

The same ``wire(...)`` serves Flask (``Idempotency(app, **metrics.wire(url))``), Django
(``RETRYSAFE = {**metrics.wire("django")}``) and the WSGI middleware: each front takes the
store's face it needs (async for ASGI, synchronous for the others).

``wire`` returns the ``store`` (wrapped, so each operation's latency is observed) and the
``on_event`` hook, labelled alike. Exported (names in :data:`METRIC_NAMES`):

- ``retrysafe_requests_total{outcome,route,store}``: keyed requests by outcome (:data:`OUTCOMES`).
- ``retrysafe_completions_total{result,store}``: responses stored late (``deferred``,
  ``recovered``, ``failed``).
- ``retrysafe_in_flight_requests{route,store}``: keyed requests whose handler is running.
- ``retrysafe_store_operation_seconds{operation,store}``: latency of each store operation.
- ``retrysafe_store_errors_total{operation,store}``: store operations that raised.

``route`` is the route template (``/orders/{record_id}``), ``unmatched`` when unknown: never the raw
path or the key; for an idempotent function's calls, ``call <function name>`` (pass
``on_event=metrics.event_hook(...)`` to ``idempotent_function``). Multi-process servers (gunicorn,
``uvicorn --workers``): set ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory before the server
starts; then :func:`metrics_response` aggregates every worker's values (prometheus_client's
multiprocess collector); under gunicorn put ``from retrysafe.contrib.prometheus import
gunicorn_child_exit as child_exit`` in its config file, so a dead worker's in-flight count stops
counting. In that mode the request counters and the gauge are written by a thread every
``flush_interval`` (1 s), so a scrape may lag the requests by that much; the hot path then writes no
file.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from .._core.config import EventHook
from ..stores import AsyncStore, Store
from ._extra import extra
from ._instrument import OUTCOMES as REQUEST_OUTCOMES
from ._instrument import InstrumentedStore, instrument, store_kind

with extra("prometheus"):
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        REGISTRY,
        CollectorRegistry,
        Counter,
        Gauge,
        Histogram,
        generate_latest,
    )
    from prometheus_client import multiprocess as _multiprocess
    from prometheus_client import values as _values

__all__ = [
    "DEFAULT_BUCKETS",
    "METRIC_NAMES",
    "OUTCOMES",
    "PrometheusMetrics",
    "gunicorn_child_exit",
    "metrics_response",
]

#: ``on_event`` event -> the ``outcome`` label of ``retrysafe_requests_total`` (the spans' outcomes,
#: and a lost lease).
OUTCOMES: dict[str, str] = {**REQUEST_OUTCOMES, "lease_lost": "lease_lost"}

_COMPLETIONS = {
    "completion_deferred": "deferred",
    "completion_recovered": "recovered",
    "completion_failed": "failed",
}

#: Store latencies are sub-millisecond (memory, SQLite) to tens of milliseconds (remote).
DEFAULT_BUCKETS = (0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5)

#: The metric names as Prometheus exposes them (counters with their ``_total`` suffix).
METRIC_NAMES: tuple[str, ...] = (
    "retrysafe_requests_total",
    "retrysafe_completions_total",
    "retrysafe_in_flight_requests",
    "retrysafe_store_operation_seconds",
    "retrysafe_store_errors_total",
)

_UNMATCHED = "unmatched"


def _nothing() -> None:
    pass


class _Timer:
    """Observes one store call: its latency always, an error count when it raised."""

    __slots__ = ("errors", "observe", "start")

    def __init__(self, observe: Callable[[float], None], errors: Callable[[], None]) -> None:
        self.observe = observe
        self.errors = errors
        self.start = 0.0

    def __enter__(self) -> _Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.observe(time.perf_counter() - self.start)
        if exc_type is not None and issubclass(exc_type, Exception):
            self.errors()


class PrometheusMetrics:
    """The retrysafe metrics on one Prometheus registry.

    Create it once per process and registry (a second instance on the same registry is refused
    by prometheus_client as a duplicate).

    Args:
        registry: where the metrics are registered (default: prometheus_client's global one).
        buckets: histogram buckets of the store latency, in seconds.
        flush_interval: in multiprocess mode, how often the counts, latencies and in-flight
            gauge are written out (seconds).
    """

    def __init__(
        self,
        *,
        registry: CollectorRegistry | None = REGISTRY,
        buckets: tuple[float, ...] = DEFAULT_BUCKETS,
        flush_interval: float = 1.0,
    ) -> None:
        # Multiprocess mode makes every update a locked write to a memory-mapped file (about
        # 0.7 us): there the hot path only adds to plain ints, and a thread writes them out
        # every flush_interval. In one process counters are incremented directly (0.2 us) and
        # the in-flight gauge is read from its int at scrape time.
        self._multiprocess = _values.ValueClass is not _values.MutexValue
        self._flush_interval = flush_interval
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._batches: list[tuple[Any, bool, list[int]]] = []  # (child, is_gauge, [value])
        self._written: list[int] = []
        self._pending: list[tuple[Any, list[float]]] = []  # (histogram child, latencies)
        self._flusher: threading.Thread | None = None
        self._flight: dict[tuple[str, str], list[int]] = {}
        # Every cache of metric children (hooks, store timers): emptied in a forked child.
        self._action_caches: list[dict[Any, Any]] = []
        os.register_at_fork(after_in_child=self._after_fork)
        self.requests = Counter(
            "retrysafe_requests",
            "Keyed requests by outcome (executed, replayed, in_progress, mismatch...).",
            ("outcome", "route", "store"),
            registry=registry,
        )
        self.completions = Counter(
            "retrysafe_completions",
            "Responses whose storing failed at first: deferred, then recovered or failed.",
            ("result", "store"),
            registry=registry,
        )
        self.in_flight = Gauge(
            "retrysafe_in_flight_requests",
            "Keyed requests whose handler is running.",
            ("route", "store"),
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.store_seconds = Histogram(
            "retrysafe_store_operation_seconds",
            "Latency of idempotency store operations.",
            ("operation", "store"),
            registry=registry,
            buckets=buckets,
        )
        self.store_errors = Counter(
            "retrysafe_store_errors",
            "Idempotency store operations that raised.",
            ("operation", "store"),
            registry=registry,
        )

    def instrument(self, store: str | AsyncStore | Store, *, label: str | None = None) -> Any:
        """Wrap a store so that every operation's latency (and failure) is recorded.

        Args:
            store: a store URL or instance, as the middleware takes it.
            label: the ``store`` label (default: the backend, e.g. ``redis``).

        Returns:
            The instrumented store, for any middleware: ASGI, WSGI, Flask, Django (each
            asks it for its face; both faces count into the same metrics).
        """
        timers: dict[str, tuple[Callable[[float], None], Callable[[], None]]] = {}
        self._action_caches.append(timers)
        instrumented: InstrumentedStore | None = None

        def observe(operation: str) -> _Timer:
            children = timers.get(operation)
            if children is None:
                assert instrumented is not None
                name = label or store_kind(instrumented.inner)
                children = timers[operation] = (
                    self._observer(self.store_seconds.labels(operation, name)),
                    self._counter(self.store_errors.labels(operation, name)),
                )
            return _Timer(*children)

        instrumented = instrument(store, observe)
        return instrumented

    def event_hook(self, store: str) -> EventHook:
        """Return an ``on_event`` hook that counts events under the ``store`` label ``store``.

        Args:
            store: the ``store`` label (use the same as :meth:`instrument`'s).

        Returns:
            The hook; it costs about a microsecond per event (a dict lookup and an increment).
        """
        actions: dict[tuple[str, object], Callable[[], None]] = {}
        self._action_caches.append(actions)

        def on_event(event: str, details: Mapping[str, Any]) -> None:
            route = details.get("route")
            if route is None and "function" in details:  # a call: labelled by its function
                route = "call " + details["function"]
            action = actions.get((event, route))
            if action is None:
                action = actions[(event, route)] = self._action(event, route, store)
            action()

        return on_event

    def _action(self, event: str, route: object, store: str) -> Callable[[], None]:
        label = route if isinstance(route, str) and route else _UNMATCHED
        if event == "settled":
            return self._adder(self._in_flight(label, store), -1)
        if event in _COMPLETIONS:
            return self._counter(self.completions.labels(_COMPLETIONS[event], store))
        outcome = OUTCOMES.get(event)
        if outcome is None:
            return _nothing  # an event these metrics do not count
        count = self._counter(self.requests.labels(outcome, label, store))
        if event != "executed":
            return count
        start = self._adder(self._in_flight(label, store), 1)

        def executed() -> None:
            count()
            start()

        return executed

    def _adder(self, cell: list[int], step: int) -> Callable[[], None]:
        lock = self._lock

        def add() -> None:
            with lock:  # += on a list item is not atomic across threads
                cell[0] += step

        return add

    def _counter(self, child: Any) -> Callable[[], None]:
        if not self._multiprocess:
            inc: Callable[[], None] = child.inc
            return inc
        return self._adder(self._batched(child, is_gauge=False), 1)

    def _observer(self, child: Any) -> Callable[[float], None]:
        if not self._multiprocess:
            observe: Callable[[float], None] = child.observe
            return observe
        pending: list[float] = []
        with self._lock:
            self._pending.append((child, pending))
            self._start_flusher()
        return pending.append  # atomic; the flusher takes the values off the front

    def _in_flight(self, route: str, store: str) -> list[int]:
        with self._lock:
            cell = self._flight.get((route, store))
        if cell is not None:
            return cell
        child = self.in_flight.labels(route, store)
        if self._multiprocess:
            cell = self._batched(child, is_gauge=True)
        else:
            cell = [0]
            child.set_function(lambda: cell[0])
        with self._lock:
            return self._flight.setdefault((route, store), cell)

    def _batched(self, child: Any, *, is_gauge: bool) -> list[int]:
        cell = [0]
        with self._lock:
            self._batches.append((child, is_gauge, cell))
            self._written.append(0)
            self._start_flusher()
        return cell

    def _start_flusher(self) -> None:  # under self._lock
        if self._flusher is None:
            self._flusher = threading.Thread(
                target=self._flush_forever, name="retrysafe-metrics", daemon=True
            )
            self._flusher.start()

    def flush(self) -> None:
        """Write the values of multiprocess mode out now (a thread does it every
        ``flush_interval``; call this before a worker exits, e.g. from gunicorn's
        ``worker_exit`` hook). A no-op in one process, where nothing waits."""
        # The file writes happen outside self._lock, which the request path takes.
        with self._flush_lock:
            with self._lock:
                pending = list(self._pending)
                values = [(child, is_gauge, cell[0]) for child, is_gauge, cell in self._batches]
                written = self._written
            for child, latencies in pending:
                taken = latencies[:]
                del latencies[: len(taken)]  # values appended meanwhile stay for the next pass
                for seconds in taken:
                    child.observe(seconds)
            for i, (child, is_gauge, value) in enumerate(values):
                if value == written[i]:
                    continue
                if is_gauge:
                    child.set(value)
                else:
                    child.inc(value - written[i])
                written[i] = value

    def _flush_forever(self) -> None:
        while True:
            time.sleep(self._flush_interval)
            self.flush()

    def _after_fork(self) -> None:
        # A forked worker starts from zero (none of the parent's requests runs in it; the
        # parent's unwritten counts are the parent's) and its flusher did not survive the fork.
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._batches = []
        self._written = []
        self._pending = []
        self._flusher = None
        self._flight = {}
        for cache in self._action_caches:
            cache.clear()

    def wire(self, store: str | AsyncStore | Store, *, label: str | None = None) -> dict[str, Any]:
        """The middleware options that turn both on: ``store`` (instrumented) and ``on_event``.

        Args:
            store: a store URL or instance.
            label: the ``store`` label (default: the backend, e.g. ``redis``).

        Returns:
            ``{"store": ..., "on_event": ...}``, for ``IdempotencyMiddleware(app, **options)``
            (ASGI or WSGI), ``Idempotency(app, **options)`` (Flask) or
            ``RETRYSAFE = {**options}`` (Django's settings).
        """
        instrumented = self.instrument(store, label=label)
        name = label or store_kind(instrumented)
        return {"store": instrumented, "on_event": self.event_hook(name)}


def metrics_response(registry: CollectorRegistry | None = None) -> tuple[bytes, str]:
    """Render the metrics for a ``/metrics`` endpoint.

    With ``PROMETHEUS_MULTIPROC_DIR`` set, the values of every process of the server are
    aggregated (prometheus_client's multiprocess collector); else ``registry`` (default: the
    global one) is rendered.

    Returns:
        ``(body, content_type)``.
    """
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        _multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return generate_latest(registry or REGISTRY), CONTENT_TYPE_LATEST


def gunicorn_child_exit(server: Any, worker: Any) -> None:
    """gunicorn's ``child_exit`` hook for multiprocess metrics.

    A worker that died (crashed, killed, recycled) leaves its files behind; this drops its
    live gauges (the in-flight count of requests it was running when it died), while its
    counters keep counting in the totals. In ``gunicorn.conf.py``::

        from retrysafe.contrib.prometheus import gunicorn_child_exit as child_exit

    Args:
        server: gunicorn's arbiter (unused).
        worker: the worker that exited.
    """
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        _multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]
