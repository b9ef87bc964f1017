"""OpenTelemetry traces for retrysafe (``pip install 'retrysafe[otel]'``: the API only).

::

    from retrysafe.asgi import IdempotencyMiddleware
    from retrysafe.contrib.otel import OpenTelemetryTracing

    tracing = OpenTelemetryTracing()        # the global tracer provider, or tracer_provider=
    app = IdempotencyMiddleware(app, **tracing.wire("postgresql://app@db/shop"))

The same ``wire(...)`` serves Flask (``Idempotency(app, **tracing.wire(url))``), Django
(``RETRYSAFE = {**tracing.wire("django")}``) and the WSGI middleware: each front takes the
store's face it needs (async for ASGI, synchronous for the others).

What it records:

- a span per store operation, ``retrysafe.<operation>`` (``retrysafe.reserve``,
  ``retrysafe.complete``, ``retrysafe.commit``...), child of the current span, with
  ``db.system.name`` (the backend) and ``idempotency.operation``; a failed operation has status
  ``ERROR`` and the exception recorded. Lease renewals run in the background and start traces
  of their own rather than join an unrelated request's;
- on the request span (the current span when the middleware runs, e.g. the one your ASGI or
  server instrumentation opened): ``idempotency.outcome`` (as the Prometheus ``outcome`` label),
  ``idempotency.replayed`` (bool), ``idempotency.record`` (a prefix of the hashed record id,
  never the key) and ``idempotency.route``;
- span events ``retrysafe.lease_lost`` and ``retrysafe.outcome_unknown`` (with ``phase``), and
  ``retrysafe.completion_deferred`` / ``_recovered`` / ``_failed``.

Without an SDK configured, the API's no-op tracer makes all of this nearly free.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from .._core.config import EventHook
from ..stores import AsyncStore, Store
from ._extra import extra
from ._instrument import OUTCOMES, InstrumentedStore, instrument, store_kind

with extra("otel"):
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider

__all__ = ["SPAN_EVENTS", "OpenTelemetryTracing"]


#: Events recorded as span events (``retrysafe.<event>``) on the request's span.
SPAN_EVENTS = frozenset(
    {
        "lease_lost",
        "outcome_unknown",
        "completion_deferred",
        "completion_recovered",
        "completion_failed",
    }
)

# Background work: a renewal is not part of whichever request happened to start the sweeper.
_BACKGROUND = frozenset({"renew"})


class OpenTelemetryTracing:
    """Spans for store operations and idempotency attributes on request spans.

    Args:
        tracer_provider: where spans go (default: the global provider).
    """

    def __init__(self, *, tracer_provider: TracerProvider | None = None) -> None:
        from .. import __version__

        self.tracer = trace.get_tracer("retrysafe", __version__, tracer_provider=tracer_provider)
        # The request span of each running keyed request, by record: an event found by the
        # lease sweeper (a renewal that lost the lease) lands on the right span.
        self._spans: dict[str, Span] = {}

    def instrument(self, store: str | AsyncStore | Store, *, label: str | None = None) -> Any:
        """Wrap a store so that each operation is a span.

        Args:
            store: a store URL or instance, as the middleware takes it.
            label: the ``db.system.name`` attribute (default: the backend, e.g. ``redis``).

        Returns:
            The instrumented store, for any middleware: ASGI, WSGI, Flask, Django (each
            asks it for its face).
        """
        tracer = self.tracer
        instrumented: InstrumentedStore | None = None
        names: dict[str, str] = {}

        @contextmanager
        def span(operation: str) -> Iterator[Span]:
            system = names.get("system")
            if system is None:
                assert instrumented is not None
                system = names["system"] = label or store_kind(instrumented.inner)
            parent = otel_context.Context() if operation in _BACKGROUND else None
            with tracer.start_as_current_span(
                "retrysafe." + operation,
                context=parent,
                kind=SpanKind.CLIENT,
                attributes={"db.system.name": system, "idempotency.operation": operation},
            ) as current:
                yield current

        def observe(operation: str) -> AbstractContextManager[Any]:
            return span(operation)

        instrumented = instrument(store, observe)
        return instrumented

    def event_hook(self) -> EventHook:
        """Return the ``on_event`` hook that annotates request spans."""
        return self.on_event

    def on_event(self, event: str, details: Mapping[str, Any]) -> None:
        """The ``on_event`` hook: attributes on the request span, events for failures."""
        record = details.get("record")
        if event == "settled":
            if record:
                self._spans.pop(record, None)
            return
        span = trace.get_current_span()
        if event == "executed" and record and span.is_recording():
            self._spans[record] = span
        elif details.get("phase") == "renew" and record:
            # Found by the lease sweeper, whose context is not this request's.
            span = self._spans.get(record, trace.INVALID_SPAN)
        outcome = OUTCOMES.get(event)
        if outcome is not None and span.is_recording():
            attributes: dict[str, Any] = {
                "idempotency.outcome": outcome,
                "idempotency.replayed": event == "replayed",
            }
            if record:
                attributes["idempotency.record"] = record
            if details.get("route"):
                attributes["idempotency.route"] = details["route"]
            if details.get("function"):  # an idempotent function's call
                attributes["idempotency.kind"] = "call"
                attributes["idempotency.function"] = details["function"]
            span.set_attributes(attributes)
        if event in SPAN_EVENTS:
            event_attributes: dict[str, Any] = {}
            for name in ("phase", "error"):
                if details.get(name) is not None:
                    event_attributes[name] = str(details[name])
            span.add_event("retrysafe." + event, event_attributes)
            if event in ("lease_lost", "completion_failed"):
                span.set_status(Status(StatusCode.ERROR, event))

    def wire(self, store: str | AsyncStore | Store, *, label: str | None = None) -> dict[str, Any]:
        """The middleware options that turn both on: ``store`` (traced) and ``on_event``.

        Returns:
            ``{"store": ..., "on_event": ...}``, for ``IdempotencyMiddleware(app, **options)``
            (ASGI or WSGI), ``Idempotency(app, **options)`` (Flask) or
            ``RETRYSAFE = {**options}`` (Django's settings).
        """
        return {"store": self.instrument(store, label=label), "on_event": self.on_event}
