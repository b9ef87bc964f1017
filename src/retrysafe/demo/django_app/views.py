"""OrderHub's views on Django: each reads the request, hands it to :mod:`..domain` and the ORM,
and answers; :class:`ProblemMiddleware` turns the domain's problems, ``?fail=1`` and a busy
database into ``application/problem+json``."""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.db import OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from ...contrib.django import idempotent
from ...contrib.django.middleware import mark_committed
from .. import domain
from .models import Order, Payment

__all__ = [
    "ProblemMiddleware",
    "index",
    "not_found",
    "order_detail",
    "orders",
    "payment_detail",
    "payments",
    "reset",
]


def _problem(problem: domain.Problem) -> HttpResponse:
    response = HttpResponse(
        problem.body(), status=problem.status, content_type="application/problem+json"
    )
    for name, value in problem.headers().items():
        response[name] = value
    return response


def _create(request: HttpRequest, model: Any) -> HttpResponse:
    kind = model.kind
    values = domain.parse_record(kind, request.body)
    knobs = domain.Knobs.from_query(request.GET.get)
    if knobs.delay:
        time.sleep(knobs.delay)
    knobs.fail_if_asked(kind)
    # With the django store the view runs inside the atomic block that also writes the stored
    # response: the row commits with it (exactly once, even on a crash).
    record = model.objects.create(
        owner=domain.owner(request.headers.get("Authorization")), **values
    )
    if not settings.RETRYSAFE.get("TRANSACTIONAL", True):
        # From here a crash must not lead to a second order: retries get "outcome unknown".
        mark_committed(request)
    if knobs.delay_after:
        time.sleep(knobs.delay_after)
    response = JsonResponse(record.as_dict(), status=201)
    response["Location"] = domain.location(kind, record.as_dict())
    return response


def _listing(request: HttpRequest, model: Any) -> HttpResponse:
    records = model.objects.order_by("-id")
    limit = domain.parse_limit(request.GET.get("limit"))
    if limit is not None:
        records = records[:limit]
    count = model.objects.count()
    return JsonResponse({"count": count, model.kind.name: [r.as_dict() for r in records]})


def _detail(model: Any, record_id: int) -> HttpResponse:
    record = model.objects.filter(pk=record_id).first() if record_id < 2**63 else None
    if record is None:
        raise domain.Problem.not_found(model.kind)
    return JsonResponse(record.as_dict())


def index(request: HttpRequest) -> HttpResponse:
    """The page at ``/``."""
    return HttpResponse(
        domain.page(settings.ORDERHUB_STORE, settings.ORDERHUB_DB),
        content_type="text/html; charset=utf-8",
    )


@csrf_exempt
@require_http_methods(["GET", "POST"])
def orders(request: HttpRequest) -> HttpResponse:
    """``GET``: the orders, newest first; ``POST``: create one (key optional)."""
    return _create(request, Order) if request.method == "POST" else _listing(request, Order)


@csrf_exempt
@idempotent(required=True)
@require_http_methods(["GET", "POST"])
def payments(request: HttpRequest) -> HttpResponse:
    """``GET``: the payments; ``POST``: create one (``Idempotency-Key`` required)."""
    return _create(request, Payment) if request.method == "POST" else _listing(request, Payment)


def order_detail(request: HttpRequest, record_id: int) -> HttpResponse:
    """One order."""
    return _detail(Order, record_id)


def payment_detail(request: HttpRequest, record_id: int) -> HttpResponse:
    """One payment."""
    return _detail(Payment, record_id)


@csrf_exempt
@require_http_methods(["POST"])
def reset(request: HttpRequest) -> HttpResponse:
    """Delete every order and payment."""
    Order.objects.all().delete()
    Payment.objects.all().delete()
    return HttpResponse(status=204)


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Django's 404 (``handler404``) as a problem too."""
    return _problem(domain.Problem(404, "Not found", "No such resource.", slug="not-found"))


def _unavailable(exc: OperationalError) -> bool:
    """Whether a database error means "busy or unreachable" (so retrying later is right)."""
    text = str(exc)
    if "locked" in text or "busy" in text:  # SQLite's single writer, past the wait's bound
        return True
    cause = type(exc.__cause__)
    # psycopg's and PyMySQL's OperationalError: the server is gone or refused the connection
    # (MySQL's also: a lock wait timed out, a deadlock).
    return cause.__module__.startswith(("psycopg", "pymysql")) and (
        cause.__name__ == "OperationalError"
    )


class ProblemMiddleware:
    """Answers the domain's problems, ``?fail=1`` and a busy or unreachable database as the
    other OrderHubs do (never a 500 with a traceback for those)."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response: HttpResponse = self.get_response(request)
        return response

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        """A domain error becomes its problem (others: Django's 500)."""
        if isinstance(exc, OperationalError) and _unavailable(exc):
            exc = domain.DatabaseUnavailable(str(exc), store="django")
        if isinstance(exc, domain.Problem | domain.DemoFailure | domain.DatabaseUnavailable):
            return _problem(domain.problem_of(exc))
        return None
