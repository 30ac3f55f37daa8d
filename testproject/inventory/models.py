"""The demo shop: products whose stock must never go below what was sold."""

from __future__ import annotations

from django.db import models

from django_redlock.models import FencedModel


class Product(FencedModel):
    """A product; every sale decrements ``stock`` under the lock ``product:<pk>``."""

    name = models.CharField(max_length=200)
    stock = models.PositiveIntegerField(default=0)

    class Meta(FencedModel.Meta):
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.stock} in stock)"


class Order(FencedModel):
    """One sale of ``quantity`` units of ``product``."""

    product = models.ForeignKey(Product, on_delete=models.CASCADE, related_name="orders")
    quantity = models.PositiveIntegerField(default=1)
    created = models.DateTimeField(auto_now_add=True)

    class Meta(FencedModel.Meta):
        ordering = ["id"]

    def __str__(self) -> str:
        return f"Order {self.pk}: {self.quantity} x {self.product_id}"


class Charge(models.Model):
    """One charge at the demo's "payment provider" (``manage.py pay``): a payment charged
    twice is two rows with one ``payment``."""

    payment = models.CharField(max_length=64, db_index=True)
    amount_cents = models.PositiveIntegerField()
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"Charge {self.pk}: {self.amount_cents} for {self.payment}"
