"""The :class:`ScheduledTick` row: what became of one tick of one ``REDLOCK_SCHEDULE`` entry
(re-exported by ``django_redlock.models``). Whether a tick ran is the effect ledger's to say
(``schedule:<entry>:<tick>``); this row is the report ``manage.py redlock schedule`` shows."""

from __future__ import annotations

from django.db import models

RUNNING = "running"
DONE = "done"
FAILED = "failed"
INTERRUPTED = "interrupted"
MISSED = "missed"
CAUGHT_UP = "caught-up"
OUTCOMES = (RUNNING, DONE, FAILED, INTERRUPTED, MISSED, CAUGHT_UP)


class ScheduledTick(models.Model):
    """One tick of one entry: run (by which scheduler, under which token), or missed."""

    entry = models.CharField(max_length=100, help_text="The REDLOCK_SCHEDULE entry.")
    tick = models.DateTimeField(help_text="The tick's time.")
    outcome = models.CharField(max_length=12, choices=[(o, o) for o in OUTCOMES])
    host = models.CharField(max_length=255, blank=True, help_text="host:pid of the scheduler.")
    token = models.BigIntegerField(null=True, blank=True, help_text="The entry lease's token.")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    note = models.TextField(blank=True, help_text="The error of a failed run, or a remark.")

    class Meta:
        app_label = "django_redlock"
        verbose_name = "scheduled tick"
        verbose_name_plural = "scheduled ticks"
        ordering = ("-tick",)
        constraints = [
            models.UniqueConstraint(fields=["entry", "tick"], name="django_redlock_tick_once")
        ]

    def __str__(self) -> str:
        return f"{self.entry} @ {self.tick.isoformat()}: {self.outcome}"
