"""FencedModels with unique keys, for the tests of deleted rows staying deleted."""

from __future__ import annotations

from django.db import models

from django_redlock.models import FencedModel


class Coupon(FencedModel):
    """A coupon identified by its unique ``code``."""

    code = models.CharField(max_length=50, unique=True)
    amount = models.IntegerField(default=0)

    class Meta(FencedModel.Meta):
        app_label = "fencing_app"

    def __str__(self) -> str:
        return self.code


class Seat(FencedModel):
    """A seat: ``(hall, number)`` is unique (a ``UniqueConstraint`` of two fields)."""

    hall = models.CharField(max_length=20)
    number = models.IntegerField()
    holder = models.CharField(max_length=50, default="")

    class Meta(FencedModel.Meta):
        app_label = "fencing_app"
        constraints = [
            *FencedModel.Meta.constraints,
            models.UniqueConstraint(fields=["hall", "number"], name="fencing_app_seat_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.hall}/{self.number}"


class Hall(models.Model):
    """A plain (unfenced) parent whose delete cascades to fenced :class:`Ticket` rows."""

    name = models.CharField(max_length=50, unique=True)

    class Meta:
        app_label = "fencing_app"

    def __str__(self) -> str:
        return self.name


class Ticket(FencedModel):
    """A fenced row deleted by cascade when its :class:`Hall` goes."""

    hall = models.ForeignKey(Hall, on_delete=models.CASCADE, related_name="+")
    code = models.CharField(max_length=50, unique=True)

    class Meta(FencedModel.Meta):
        app_label = "fencing_app"

    def __str__(self) -> str:
        return self.code


class Event(FencedModel):
    """A fenced parent whose fenced delete cascades to fenced :class:`Pass` rows."""

    name = models.CharField(max_length=50, unique=True)

    class Meta(FencedModel.Meta):
        app_label = "fencing_app"

    def __str__(self) -> str:
        return self.name


class Pass(FencedModel):
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="+")
    code = models.CharField(max_length=50, unique=True)

    class Meta(FencedModel.Meta):
        app_label = "fencing_app"

    def __str__(self) -> str:
        return self.code
