"""OrderHub's routes (those of every OrderHub)."""

from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("", views.index),
    path("orders", views.orders),
    path("orders/<int:record_id>", views.order_detail),
    path("payments", views.payments),
    path("payments/<int:record_id>", views.payment_detail),
    path("reset", views.reset),
]

handler404 = "retrysafe.demo.django_app.views.not_found"
