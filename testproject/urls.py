from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("inventory/", include("testproject.inventory.urls")),
]
if "django_prometheus" in settings.INSTALLED_APPS:  # REDLOCK_DEMO_METRICS=1: GET /metrics
    urlpatterns.append(path("", include("django_prometheus.urls")))
