"""The demo's URLs plus django-prometheus's ``/metrics``."""

from __future__ import annotations

from django.urls import include, path

from testproject.urls import urlpatterns as demo_urls

urlpatterns = [*demo_urls, path("", include("django_prometheus.urls"))]
