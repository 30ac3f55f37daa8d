"""URLconf of ``tests/nodes/test_health_check.py`` and ``tests/nodes/test_node_health.py``: the
plain view,
django-health-check's, and the admin (its node panel)."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path
from health_check.views import HealthCheckView

from django_redlock.contrib.health.views import health

urlpatterns = [
    path("admin/", admin.site.urls),
    path("health/", health),
    path("ht/", HealthCheckView.as_view(checks=["django_redlock.contrib.health.checks.Redlock"])),
]
