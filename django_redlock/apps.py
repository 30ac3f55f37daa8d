"""The app config: registers the system checks (under their own tag) when Django is ready."""

from __future__ import annotations

from django.apps import AppConfig
from django.core import checks


class DjangoRedlockConfig(AppConfig):
    name = "django_redlock"
    verbose_name = "Distributed locks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks as redlock_checks
        from .request_locks import checks as request_checks

        tag = redlock_checks.TAG
        checks.register(redlock_checks.check_settings, tag)
        checks.register(redlock_checks.check_deployment, tag, deploy=True)
        checks.register(request_checks.check_request_locks, tag, checks.Tags.urls)
