"""URLconf of ``tests/test_health_check.py``: the plain view and django-health-check's."""

from __future__ import annotations

from django.urls import path
from health_check.views import HealthCheckView

from django_redlock.contrib.health.views import health

urlpatterns = [
    path("health/", health),
    path("ht/", HealthCheckView.as_view(checks=["django_redlock.contrib.health.checks.Redlock"])),
]
