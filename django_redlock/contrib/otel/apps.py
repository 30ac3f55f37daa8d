"""The app config: makes the spans observe the lock signals when Django is ready."""

from __future__ import annotations

from django.apps import AppConfig


class OtelConfig(AppConfig):
    name = "django_redlock.contrib.otel"
    label = "django_redlock_otel"
    verbose_name = "Distributed locks: OpenTelemetry spans"

    def ready(self) -> None:
        from .spans import LockSpans

        LockSpans().connect()
