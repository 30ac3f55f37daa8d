"""The API app's URLs (see the package docstring)."""

from __future__ import annotations

from django.urls import include, path
from rest_framework.routers import SimpleRouter

from . import async_views, drf_views
from .ninja_api import api

router = SimpleRouter()
router.register("orders", drf_views.OrderViewSet, basename="orders")

urlpatterns = [
    path("drf/under/<str:order>/", drf_views.under_api_view, name="drf-under"),
    path("drf/per-user/<str:order>/", drf_views.per_user_lock),
    path("drf/clients/<str:order>/", drf_views.users_and_clients),
    path("drf/clients-only/<str:order>/", drf_views.clients_only, name="drf-clients-only"),
    path("drf/above/<str:order>/", drf_views.above_api_view),
    path("drf/method-decorator/<str:order>/", drf_views.PayView.as_view()),
    path("drf/method/<str:order>/", drf_views.DirectPayView.as_view()),
    path("drf/", include(router.urls)),
    path("ninja/", api.urls),
    path("asgi/pay/<str:order>/", async_views.async_pay),
    path("asgi/pay-sync/<str:order>/", async_views.sync_pay),
    path("ready/", async_views.ready),
]
