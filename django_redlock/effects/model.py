"""The :class:`Effect` row: one effect of the ledger (re-exported by ``django_redlock.models``)."""

from __future__ import annotations

from django.db import models

#: The longest effect key (a unique ``CharField``: portable index size on every backend).
MAX_KEY_LENGTH = 255

#: The longest alias the ledger records.
MAX_ALIAS_LENGTH = 200

BEGUN = "begun"
DONE = "done"


class Effect(models.Model):
    """One effect of ``lease.once(key)``: begun (by a holder that may still run it, or that
    was interrupted) or done, with the fencing token of the last holder that touched it."""

    STATES = ((BEGUN, "begun"), (DONE, "done"))

    key = models.CharField(max_length=MAX_KEY_LENGTH, unique=True, help_text="The effect's key.")
    alias = models.CharField(
        max_length=MAX_ALIAS_LENGTH,
        help_text="REDLOCK alias of the leases (their tokens are comparable).",
    )
    state = models.CharField(max_length=8, choices=STATES, default=BEGUN)
    token = models.BigIntegerField(
        help_text="Fencing token of the last holder that began or did it."
    )
    lock_name = models.CharField(max_length=512, help_text="Name of that holder's lock.")
    attempts = models.PositiveIntegerField(default=1, help_text="How many times it was begun.")
    began_at = models.DateTimeField(help_text="When it was last begun.")
    began_by = models.CharField(max_length=255, help_text="host:pid that last began it.")
    done_at = models.DateTimeField(null=True, blank=True, help_text="When it was done.")

    class Meta:
        app_label = "django_redlock"
        verbose_name = "effect"
        verbose_name_plural = "effects"
        ordering = ("-began_at",)

    def __str__(self) -> str:
        return f"{self.key} ({self.state}, token {self.token})"
