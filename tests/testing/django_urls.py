"""A user's Django project in miniature: one view, marked with ``@idempotent``."""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from retrysafe.contrib.django import idempotent

from .apps import DJANGO_ORDERS


@csrf_exempt
@idempotent(required=True)
def create(request: HttpRequest) -> Any:
    DJANGO_ORDERS.wait_sync()
    order = DJANGO_ORDERS.create(json.loads(request.body or b"{}"))
    response = JsonResponse(order, status=201)
    response["Location"] = f"/orders/{order['id']}"
    return response


urlpatterns = [path("orders", create)]
