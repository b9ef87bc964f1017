"""Views of the Django test project: counters, gates and knobs the tests drive."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.utils.decorators import method_decorator
from django.utils.deprecation import MiddlewareMixin
from django.views import View
from django.views.decorators.csrf import csrf_exempt
from rest_framework import viewsets
from rest_framework.decorators import action, api_view
from rest_framework.response import Response
from rest_framework.views import APIView

import retrysafe.contrib.django as retrysafe_django
from retrysafe.contrib.django import idempotent
from retrysafe.demo.django_app.models import Order

CALLS: Counter[str] = Counter()
#: name -> (entered, release): a view called with ?gate=name sets ``entered`` and waits.
GATES: dict[str, tuple[threading.Event, threading.Event]] = {}


def gate(name: str) -> tuple[threading.Event, threading.Event]:
    """Create (or reset) the gate ``name``."""
    GATES[name] = (threading.Event(), threading.Event())
    return GATES[name]


def _answer(request: HttpRequest, name: str) -> HttpResponse:
    n = CALLS[name] = CALLS[name] + 1
    if request.GET.get("gate"):
        entered, release = GATES[request.GET["gate"]]
        entered.set()
        release.wait(10)
    if request.GET.get("fail"):
        raise RuntimeError("the view failed on purpose")
    user = getattr(request, "user", None)
    data = {"n": n, "body": request.body.decode(), "user": str(user) if user else None}
    response = JsonResponse(data, status=int(request.GET.get("status", "201")))
    response["Location"] = f"/{name}/{n}"
    response.set_cookie("session-like", "secret")
    return response


@csrf_exempt
def orders(request: HttpRequest, pk: int | None = None) -> HttpResponse:
    return _answer(request, "orders")


@csrf_exempt
async def aorders(request: HttpRequest) -> HttpResponse:
    n = CALLS["aorders"] = CALLS["aorders"] + 1
    if request.GET.get("gate"):
        entered, release = GATES[request.GET["gate"]]
        entered.set()
        await asyncio.to_thread(release.wait, 10)
    return JsonResponse({"n": n, "body": request.body.decode()}, status=201)


@csrf_exempt
@idempotent(required=True)
def required(request: HttpRequest) -> HttpResponse:
    return _answer(request, "required")


@csrf_exempt
@idempotent(enabled=False)
def optout(request: HttpRequest) -> HttpResponse:
    return _answer(request, "optout")


@csrf_exempt
def streaming(request: HttpRequest) -> HttpResponse:
    n = CALLS["streaming"] = CALLS["streaming"] + 1
    return StreamingHttpResponse((f"part{i}-{n};".encode() for i in range(3)), status=201)


@method_decorator(csrf_exempt, name="dispatch")
@idempotent(required=True)
class RequiredView(View):
    """Marked on the class: every protected method requires a key."""

    def post(self, request: HttpRequest) -> HttpResponse:
        return _answer(request, "cbv")


@method_decorator(csrf_exempt, name="dispatch")
class MethodView(View):
    """Marked on ``post`` only: PATCH keeps the app-wide settings."""

    @idempotent(required=True)
    def post(self, request: HttpRequest) -> HttpResponse:
        return _answer(request, "cbv-method")

    def patch(self, request: HttpRequest) -> HttpResponse:
        return _answer(request, "cbv-method")


class DrfView(APIView):
    @idempotent(required=True)
    def post(self, request: Any) -> Response:
        CALLS["drf"] += 1
        return Response({"n": CALLS["drf"], "data": request.data}, status=201)


class DrfViewSet(viewsets.ViewSet):
    @idempotent(required=True)
    def create(self, request: Any) -> Response:
        CALLS["drf-create"] += 1
        return Response({"n": CALLS["drf-create"]}, status=201)

    @action(detail=False, methods=["post"])
    @idempotent(enabled=False)
    def ping(self, request: Any) -> Response:
        CALLS["drf-ping"] += 1
        return Response({"n": CALLS["drf-ping"]}, status=200)


@csrf_exempt
def orm_orders(request: HttpRequest) -> HttpResponse:
    """Creates an Order through the ORM on ``?db=`` (default: ``default``)."""
    alias = request.GET.get("db", "default")
    order = Order.objects.using(alias).create(owner="t", item=request.body.decode(), quantity=1)
    if request.GET.get("gate"):
        entered, release = GATES[request.GET["gate"]]
        entered.set()
        release.wait(10)
    if request.GET.get("fail"):
        raise RuntimeError("failed after the write")
    return JsonResponse({"id": order.pk}, status=int(request.GET.get("status", "201")))


@csrf_exempt
@transaction.non_atomic_requests
def orm_non_atomic(request: HttpRequest) -> HttpResponse:
    return orm_orders(request)


class ReadPostMiddleware(MiddlewareMixin):
    """Parses ``request.POST`` before the retrysafe middleware when ``X-Read-Post`` is sent, as
    CsrfViewMiddleware does for real form posts (a multipart body is then read from the stream
    and its raw bytes are gone). Sync and async capable, like Django's own middleware, so the
    async stack stays async down to the retrysafe middleware."""

    def process_view(self, request: HttpRequest, *args: Any) -> None:
        if "X-Read-Post" in request.headers:
            request.POST  # noqa: B018


@csrf_exempt
def upload(request: HttpRequest) -> HttpResponse:
    n = CALLS["upload"] = CALLS["upload"] + 1
    files = {name: f.read().decode() for name, f in request.FILES.items()}
    return JsonResponse({"n": n, "fields": dict(request.POST.items()), "files": files}, status=201)


@csrf_exempt
async def mode(request: HttpRequest) -> HttpResponse:
    """Which runner claimed the key: ``Exchange`` (sync stack) or ``AsyncExchange``."""
    return HttpResponse(type(getattr(request, "_retrysafe_exchange", None)).__name__)


@csrf_exempt
async def aorm_orders(request: HttpRequest) -> HttpResponse:
    """The async twin of :func:`orm_orders` (Django's async ORM API)."""
    alias = request.GET.get("db", "default")
    order = await Order.objects.using(alias).acreate(
        owner="t", item=request.body.decode(), quantity=1
    )
    if request.GET.get("fail"):
        raise RuntimeError("failed after the write")
    return JsonResponse({"id": order.pk}, status=201)


@idempotent(required=True)  # above @api_view: it marks the view function DRF builds
@api_view(["POST"])
def drf_function(request: Any) -> Response:
    CALLS["drf-function"] += 1
    return Response({"n": CALLS["drf-function"]}, status=201)


@csrf_exempt
def sql_orders(request: HttpRequest) -> HttpResponse:
    """Writes on the SQL URL store's own transaction (``retrysafe.contrib.django.transaction``)."""
    conn = retrysafe_django.transaction(request)
    conn.execute("CREATE TABLE IF NOT EXISTS sql_orders (item TEXT)")
    conn.execute("INSERT INTO sql_orders VALUES (?)", (request.body.decode(),))
    if request.GET.get("fail"):
        raise RuntimeError("failed after the write")
    return JsonResponse({"ok": True}, status=201)
