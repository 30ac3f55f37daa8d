"""Models of django-redlock."""

from __future__ import annotations

from django.db import models

from .effects.model import Effect as Effect
from .fencing import FencedModel as FencedModel
from .fencing.tombstones import FenceTombstone as FenceTombstone
from .schedules.model import ScheduledTick as ScheduledTick


class Lock(models.Model):
    """An unmanaged stand-in for held locks: it gives the admin its "Locks" entry and the
    ``view_lock``/``delete_lock`` permissions. No table exists; locks live in Redis and are
    read by :mod:`django_redlock.inspection`."""

    alias = models.CharField(max_length=200)
    name = models.CharField(max_length=512)

    class Meta:
        managed = False
        db_table = "django_redlock_lock"
        verbose_name = "lock"
        verbose_name_plural = "locks"

    def __str__(self) -> str:
        return f"{self.alias}:{self.name}"
