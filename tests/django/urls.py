"""Routes of the Django test project."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path
from rest_framework.routers import SimpleRouter

from . import views

router = SimpleRouter(trailing_slash=False)
router.register("drf/set", views.DrfViewSet, basename="drfset")

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders", views.orders),
    path("orders/<int:pk>", views.orders),
    path("aorders", views.aorders),
    path("required", views.required),
    path("optout", views.optout),
    path("streaming", views.streaming),
    path("cbv", views.RequiredView.as_view()),
    path("cbv-method", views.MethodView.as_view()),
    path("drf/api", views.DrfView.as_view()),
    path("drf/function", views.drf_function),
    path("orm/orders", views.orm_orders),
    path("orm/aorders", views.aorm_orders),
    path("upload", views.upload),
    path("sql/orders", views.sql_orders),
    path("mode", views.mode),
    path("orm/non-atomic", views.orm_non_atomic),
    *router.urls,
]
