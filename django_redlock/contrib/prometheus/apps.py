"""The app config: makes the metrics observe the lock signals when Django is ready."""

from __future__ import annotations

from django.apps import AppConfig


class PrometheusConfig(AppConfig):
    name = "django_redlock.contrib.prometheus"
    label = "django_redlock_prometheus"
    verbose_name = "Distributed locks: Prometheus metrics"

    def ready(self) -> None:
        from .metrics import default_metrics

        default_metrics().connect()
