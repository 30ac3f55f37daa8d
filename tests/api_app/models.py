"""The effect the API views make: one payment row per run, counted by the tests (outside the
library)."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Payment(models.Model):
    """One run of a paying view: who, for which order, through which view."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.CASCADE)
    order = models.CharField(max_length=64)
    via = models.CharField(max_length=64)
    principal = models.CharField(max_length=128, default="")

    class Meta:
        app_label = "api_app"

    def __str__(self) -> str:
        return f"{self.via} {self.order} for {self.user_id or self.principal}"


class ApiClient(models.Model):
    """A caller that is not a user (a DRF authentication class puts it in ``request.user``)."""

    name = models.CharField(max_length=64, unique=True)

    class Meta:
        app_label = "api_app"

    def __str__(self) -> str:
        return self.name

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def username(self) -> str:
        return f"client:{self.name}"
