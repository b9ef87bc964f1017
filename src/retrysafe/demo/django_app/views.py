"""OrderHub's views: the Starlette OrderHub's contract (routes, ``Location``, the knobs
``delay_ms``, ``delay_after_ms`` and ``fail``, ``Authorization: Bearer <name>`` owners)."""

from __future__ import annotations

import json
import time
from importlib import resources
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from ...contrib.django import idempotent
from ...contrib.django.middleware import mark_committed
from .._contract import DemoFailure, InvalidRecord, knob_ms, parse_record
from .models import Order, Payment

__all__ = ["index", "order_detail", "orders", "payment_detail", "payments", "reset"]

_PAGE = resources.files("retrysafe.demo").joinpath("static", "index.html").read_bytes()


def _problem(status: int, title: str, detail: str) -> HttpResponse:
    body = {"type": "urn:orderhub:problem:invalid-request", "title": title, "status": status}
    body["detail"] = detail
    return HttpResponse(json.dumps(body), status=status, content_type="application/problem+json")


def _owner(request: HttpRequest) -> str:
    scheme, _, name = request.headers.get("Authorization", "").partition(" ")
    return name.strip() if scheme.lower() == "bearer" and name.strip() else "anonymous"


def _int_param(request: HttpRequest, name: str) -> int:
    return knob_ms(request.GET.get(name))


def _create(request: HttpRequest, model: Any, kind: str, fields: dict[str, type]) -> HttpResponse:
    try:
        values = parse_record(request.body, kind, fields)
    except InvalidRecord as bad:
        return _problem(bad.status, bad.title, bad.detail)
    delay_ms = _int_param(request, "delay_ms")
    if delay_ms:
        time.sleep(delay_ms / 1000)
    if request.GET.get("fail") == "1":
        raise DemoFailure(f"the {kind} handler failed on purpose (?fail=1)")
    # With the django store the view runs inside the atomic block that also writes the stored
    # response: the row commits with it (exactly once, even on a crash).
    record = model.objects.create(owner=_owner(request), **values)
    if not settings.RETRYSAFE.get("TRANSACTIONAL", True):
        # From here a crash must not lead to a second order: retries get "outcome unknown".
        mark_committed(request)
    delay_after_ms = _int_param(request, "delay_after_ms")
    if delay_after_ms:
        time.sleep(delay_after_ms / 1000)
    response = JsonResponse(record.as_dict(), status=201)
    response["Location"] = f"/{kind}/{record.pk}"
    return response


def _listing(request: HttpRequest, model: Any, kind: str) -> HttpResponse:
    records = model.objects.order_by("-id")
    if "limit" in request.GET:
        try:
            records = records[: max(0, int(request.GET["limit"]))]
        except ValueError:
            return _problem(400, "Bad limit", "limit must be an integer.")
    count = model.objects.count()
    return JsonResponse({"count": count, kind: [r.as_dict() for r in records]})


def index(request: HttpRequest) -> HttpResponse:
    """The page at ``/``."""
    return HttpResponse(_PAGE, content_type="text/html; charset=utf-8")


@csrf_exempt
@require_http_methods(["GET", "POST"])
def orders(request: HttpRequest) -> HttpResponse:
    """``GET``: the orders, newest first; ``POST``: create one (key optional)."""
    if request.method == "POST":
        return _create(request, Order, "orders", {"item": str, "quantity": int})
    return _listing(request, Order, "orders")


@csrf_exempt
@idempotent(required=True)
@require_http_methods(["GET", "POST"])
def payments(request: HttpRequest) -> HttpResponse:
    """``GET``: the payments; ``POST``: create one (``Idempotency-Key`` required)."""
    if request.method == "POST":
        return _create(request, Payment, "payments", {"amount": int, "currency": str})
    return _listing(request, Payment, "payments")


def _detail(model: Any, kind: str, record_id: int) -> HttpResponse:
    record = model.objects.filter(pk=record_id).first()
    if record is None:
        return _problem(404, "Not found", f"No such {kind[:-1]}.")
    return JsonResponse(record.as_dict())


def order_detail(request: HttpRequest, record_id: int) -> HttpResponse:
    """One order."""
    return _detail(Order, "orders", record_id)


def payment_detail(request: HttpRequest, record_id: int) -> HttpResponse:
    """One payment."""
    return _detail(Payment, "payments", record_id)


@csrf_exempt
@require_http_methods(["POST"])
def reset(request: HttpRequest) -> HttpResponse:
    """Delete every order and payment."""
    Order.objects.all().delete()
    Payment.objects.all().delete()
    return HttpResponse(status=204)


class FailureMiddleware:
    """Answers the ``?fail=1`` knob's exception with the Starlette OrderHub's 500 problem."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response: HttpResponse = self.get_response(request)
        return response

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        """A :class:`DemoFailure` becomes a 500 problem (others: Django's 500)."""
        if isinstance(exc, DemoFailure):
            return _problem(500, "Handler failed", str(exc))
        return None
