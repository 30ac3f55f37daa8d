from __future__ import annotations

from django.apps import AppConfig


class ApiAppConfig(AppConfig):
    name = "tests.api_app"
    label = "api_app"
    default_auto_field = "django.db.models.BigAutoField"
